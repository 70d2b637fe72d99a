import AttestWire
import Foundation
import Testing

@Suite struct Base64Tests {
    @Test func agreesWithFoundationInAllFourSpellings() {
        var generator = SystemRandomNumberGenerator()
        for length in 0..<70 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let standard = Data(bytes).base64EncodedString()
            #expect(Base64.encode(bytes) == standard)
            let urlSafe = standard.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            #expect(Base64.encode(bytes, urlSafe: true) == urlSafe)
            let unpadded = urlSafe.replacingOccurrences(of: "=", with: "")
            #expect(bytes.withUnsafeBytes { Base64.encode($0, urlSafe: true, padded: false, after: "req_") } == "req_" + unpadded)
            #expect(bytes.withUnsafeBytes { Base64.encode($0, after: "") } == standard)
            for spelling in [standard, urlSafe, standard.replacingOccurrences(of: "=", with: ""), urlSafe.replacingOccurrences(of: "=", with: "")] {
                #expect(Base64.decode(spelling) == bytes, "\(spelling)")
            }
        }
    }

    @Test func aPrefixOfAnyLengthComesFirst() {
        let bytes: [UInt8] = [1, 2, 3, 0xfb, 0xff]
        #expect(bytes.withUnsafeBytes { Base64.encode($0, after: "r") } == "rAQID+/8=")
        #expect(bytes.withUnsafeBytes { Base64.encode($0, urlSafe: true, padded: false, after: "é_") } == "é_AQID-_8")
    }

    @Test func rejectsWhatIsNotBase64() {
        for bad in ["A", "AAAAA", "AA=A", "AAA==", "A===", "AA*A", "AB==", "AAB=", "====", "AA==="] {
            #expect(Base64.decode(bad) == nil, "\(bad)")
        }
        #expect(Base64.decode("") == [])
        #expect(Base64.decode("AA==") == [0])
        #expect(Base64.decode("AA") == [0])
    }
}
