import AttestWire
import CommandLineSupport
import Foundation
import TokenService

/// `attestctl devices list|show`: the inventory of what each device said when it registered and
/// when it last refreshed.
enum DeviceCommands {
    static func list(_ arguments: Arguments) throws {
        let clientID = try arguments.required("client-id")
        let limit = try arguments.integer("limit", default: 1000, range: 1...1_000_000)!
        let riskOver = try arguments.integer("risk-over", range: 0...1_000_000_000)
        let (service, _) = try AdminCommands.open(arguments)
        // --risk-over: Apple's signal of a device serving many installs, highest metric first.
        let devices = try service.devices(clientID, limit: limit, riskOver: riskOver)
        if arguments.has("json") {
            printJSON(["devices": devices.map(record)])
        } else if devices.isEmpty {
            print("no devices")
        } else {
            for device in devices { print(line(record(device))) }
        }
    }

    static func show(_ arguments: Arguments) throws {
        let text = arguments.positional[0]
        guard let keyID = keyID(text) else { throw UsageError("KEY_ID \(text.prefix(80)) is not 32 bytes in base64 or hex") }
        let (service, _) = try AdminCommands.open(arguments)
        let device = try service.device(keyID: keyID)
        if arguments.has("json") {
            printJSON(record(device))
        } else {
            let fields = record(device)
            for key in fieldOrder { print("\(key): \(AdminCommands.text(fields[key]))") }
        }
    }

    /// A key ID as the audit trail and the wire spell it (base64, either alphabet) or as hex.
    static func keyID(_ text: String) -> [UInt8]? {
        if text.utf8.count == 64, let bytes = hexBytes(text) { return bytes }
        guard let bytes = Base64.decode(text), bytes.count == 32 else { return nil }
        return bytes
    }

    static func hexBytes(_ text: String) -> [UInt8]? {
        var bytes: [UInt8] = []
        var iterator = text.utf8.makeIterator()
        while let high = iterator.next() {
            guard let low = iterator.next(), let h = nibble(high), let l = nibble(low) else { return nil }
            bytes.append(h << 4 | l)
        }
        return bytes
    }

    static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: c - 0x30
        case 0x61...0x66: c - 0x61 + 10
        case 0x41...0x46: c - 0x41 + 10
        default: nil
        }
    }

    static let fieldOrder = ["key_id", "client_id", "platform", "distribution", "validation_category", "bundle_version", "os_version",
                             "environment", "app_id", "counter", "registered_at", "last_refresh_at", "risk", "risk_metric",
                             "risk_checked_at", "risk_over_limit_at", "receipt_expires_at"]

    static func record(_ device: Device) -> [String: Any] {
        ["key_id": Data(device.keyID).base64EncodedString(), "client_id": device.clientID,
         "platform": device.platform?.rawValue ?? NSNull(), "distribution": device.distribution?.rawValue ?? NSNull(),
         "validation_category": device.validationCategory.map { Int($0) } ?? NSNull(),
         "bundle_version": device.bundleVersion ?? NSNull(), "os_version": device.osVersion ?? NSNull(),
         "environment": device.environment.rawValue, "app_id": device.appID, "counter": Int(device.counter),
         "registered_at": device.registeredAt.map(AdminCommands.iso8601) ?? NSNull(), "last_refresh_at": device.lastRefreshAt.map(AdminCommands.iso8601) ?? NSNull(),
         // risk: the band, or unknown (receipts unchecked, no Apple key for the team, or no refresh yet).
         "risk": DeviceRisk.band(device.risk?.metric), "risk_metric": device.risk?.metric ?? NSNull(),
         "risk_checked_at": device.risk?.checkedAt.map(AdminCommands.iso8601) ?? NSNull(),
         "risk_over_limit_at": device.risk?.overLimitAt.map(AdminCommands.iso8601) ?? NSNull(),
         "receipt_expires_at": device.risk?.receiptExpiresAt.map(AdminCommands.iso8601) ?? NSNull()]
    }

    static func line(_ fields: [String: Any]) -> String {
        fieldOrder.map { "\($0)=\(AdminCommands.text(fields[$0]))" }.joined(separator: "  ")
    }
}
