import Testing
@testable import CloudUpstreams

/// The credential endpoints' answers as the relay reads them: AWS STS's XML, container and IMDS
/// JSON, Entra ID's token JSON (numbers and strings of digits), ISO 8601 times; and what is refused.
@Suite struct CredentialRepliesTests {
    static func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

    @Test func stsCredentialsAreReadWithTheirEntitiesAndExpiration() throws {
        let xml = """
        <AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult><Credentials>\
        <AccessKeyId>ASIAEXAMPLE000000001</AccessKeyId><SecretAccessKey>s3cr3t/Key+abc</SecretAccessKey>\
        <SessionToken>IQoJ&amp;token==</SessionToken><Expiration>2026-12-06T08:00:00Z</Expiration></Credentials>\
        </AssumeRoleResult></AssumeRoleResponse>
        """
        let keys = try CredentialReplies.stsCredentials(Self.bytes(xml))
        #expect(keys.accessKeyID == "ASIAEXAMPLE000000001" && keys.secretAccessKey == "s3cr3t/Key+abc" && keys.sessionToken == "IQoJ&token==")
        #expect(keys.expiration == 1_796_544_000)
    }

    @Test func stsErrorsNameTheirCodeAndMessage() {
        let xml = "<ErrorResponse><Error><Type>Sender</Type><Code>InvalidIdentityToken</Code><Message>No OpenIDConnect provider</Message></Error></ErrorResponse>"
        #expect(throws: CredentialReplyError("STS refused: InvalidIdentityToken (No OpenIDConnect provider)")) {
            try CredentialReplies.stsCredentials(Self.bytes(xml))
        }
        #expect(throws: CredentialReplyError.self) { try CredentialReplies.stsCredentials(Self.bytes("<Credentials><AccessKeyId>short</AccessKeyId></Credentials>")) }
        // A header-breaking byte in a key is refused, not passed on.
        let broken = "<Credentials><AccessKeyId>ASIAEXAMPLE000000001</AccessKeyId><SecretAccessKey>a\r\nb</SecretAccessKey><SessionToken>t</SessionToken><Expiration>2026-12-06T08:00:00Z</Expiration></Credentials>"
        #expect(throws: CredentialReplyError.self) { try CredentialReplies.stsCredentials(Self.bytes(broken)) }
        #expect(throws: CredentialReplyError.self) { try CredentialReplies.stsCredentials([UInt8](repeating: 0x20, count: CredentialReplies.maxReply + 1)) }
    }

    @Test func containerAndIMDSJSON() throws {
        let imds = #"{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"ASIAEXAMPLE000000002","SecretAccessKey":"k","Token":"t","Expiration":"2026-12-06T14:00:00.500Z"}"#
        let keys = try CredentialReplies.awsJSONCredentials(Self.bytes(imds), source: "IMDSv2")
        #expect(keys.accessKeyID == "ASIAEXAMPLE000000002" && keys.sessionToken == "t" && keys.expiration == 1_796_565_600)
        #expect(throws: CredentialReplyError.self) {
            try CredentialReplies.awsJSONCredentials(Self.bytes(#"{"Code":"AssumeRoleUnauthorizedAccess","Message":"no"}"#), source: "IMDSv2")
        }
        #expect(throws: CredentialReplyError.self) {
            try CredentialReplies.awsJSONCredentials(Self.bytes(#"{"AccessKeyId":"ASIAEXAMPLE000000002","SecretAccessKey":"k","Expiration":"tomorrow"}"#), source: "x")
        }
    }

    @Test func entraTokensWithNumbersOrStringsAndExpiresOn() throws {
        let v2 = try CredentialReplies.entraToken(Self.bytes(#"{"token_type":"Bearer","expires_in":3599,"access_token":"eyJ.a.b"}"#), now: 0)
        #expect(v2.accessToken == "eyJ.a.b" && v2.expiresIn == 3599)
        let imds = try CredentialReplies.entraToken(Self.bytes(#"{"access_token":"eyJ.c","expires_in":"86399","expires_on":"99","token_type":"Bearer"}"#), now: 0)
        #expect(imds.expiresIn == 86399)
        let appService = try CredentialReplies.entraToken(Self.bytes(#"{"access_token":"eyJ.d","expires_on":"1700003600","token_type":"Bearer"}"#), now: 1_700_000_000)
        #expect(appService.expiresIn == 3600)
        #expect(throws: CredentialReplyError("the token endpoint refused: invalid_client (AADSTS7000215: Invalid client secret provided.)")) {
            try CredentialReplies.entraToken(Self.bytes(#"{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided."}"#), now: 0)
        }
        // Expired, overflowing, or not a bearer token: refused.
        #expect(throws: CredentialReplyError.self) { try CredentialReplies.entraToken(Self.bytes(#"{"access_token":"x","expires_on":"5"}"#), now: 10) }
        #expect(throws: CredentialReplyError.self) { try CredentialReplies.entraToken(Self.bytes(#"{"access_token":"x","expires_in":"9999999999999999999999"}"#), now: 0) }
        #expect(throws: CredentialReplyError.self) { try CredentialReplies.entraToken(Self.bytes(#"{"access_token":"x","expires_in":60,"token_type":"pop"}"#), now: 0) }
    }

    @Test func iso8601Times() {
        func read(_ text: String) -> Int64? { CredentialReplies.epochSeconds(iso8601: Array(text.utf8)[...]) }
        #expect(read("1970-01-01T00:00:00Z") == 0)
        #expect(read("2024-02-29T12:00:00+00:00") == 1_709_208_000)
        #expect(read("2023-02-29T12:00:00Z") == nil)
        #expect(read("2026-13-01T00:00:00Z") == nil)
        #expect(read("2026-12-06T08:00:00") == nil)
        #expect(read("9999-12-31T23:59:59Z") == 253_402_300_799)
    }
}
