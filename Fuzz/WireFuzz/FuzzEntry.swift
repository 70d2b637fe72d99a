// libFuzzer entry point for the request bodies the device routes parse (`make fuzz-wire`): form
// bodies (the token request), base64 in its four spellings, and the JSON shapes of the challenge
// and register requests. Built by swiftc with -sanitize=fuzzer,address straight from
// Sources/AttestWire, so it fuzzes the shipped code.
import Foundation

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWire(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    // Form bodies: whatever decodes must hold only valid UTF-8 names and values.
    if let fields = try? FormEncoding.decode(bytes) {
        for (name, value) in fields {
            // Encoding and decoding again gives the same field back.
            let again = try? FormEncoding.decode(Array((FormEncoding.percentEncode(name) + "=" + FormEncoding.percentEncode(value)).utf8))
            if again?[name] != value { fatalError("form field did not survive a round trip") }
        }
    }
    // Base64: a decoded value re-encodes to a spelling that decodes to the same bytes.
    let text = String(decoding: bytes, as: UTF8.self)
    if let decoded = Base64.decode(text) {
        for urlSafe in [false, true] {
            for padded in [false, true] where Base64.decode(Base64.encode(decoded, urlSafe: urlSafe, padded: padded)) != decoded {
                fatalError("base64 round trip changed the bytes")
            }
        }
    }
    // JSON request shapes: decoding never traps, and what decodes re-encodes to the same shape.
    let data = Data(bytes)
    if let challenge = try? JSONDecoder().decode(ChallengeRequest.self, from: data),
       (try? JSONDecoder().decode(ChallengeRequest.self, from: Data(challenge.json.utf8))) != challenge {
        fatalError("challenge request did not survive a round trip")
    }
    if let register = try? JSONDecoder().decode(RegisterRequest.self, from: data),
       (try? JSONDecoder().decode(RegisterRequest.self, from: Data(register.json.utf8))) != register {
        fatalError("register request did not survive a round trip")
    }
    _ = try? JSONDecoder().decode(TokenResponse.self, from: data)
    return 0
}
