// Hand-written Swift over the generated bindings: the client's events as an
// AsyncSequence. (Not compiled on the development machine: it has no Swift
// compiler; the generated bindings' C header is checked with gcc instead.)
import Foundation

public struct PushEventSequence: AsyncSequence {
    public typealias Element = PushEvent
    let client: PushClient

    public struct AsyncIterator: AsyncIteratorProtocol {
        let client: PushClient
        public mutating func next() async -> PushEvent? {
            await client.nextEvent()
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(client: client)
    }
}

extension PushClient {
    /// Every event of a client created without a listener; ends once the client has stopped.
    /// `for await event in client.events { ... }`
    public var events: PushEventSequence { PushEventSequence(client: self) }
}

/// A `SessionStore` in the Keychain (generic password item).
public final class KeychainSessionStore: SessionStore {
    private let service: String
    private let account: String

    public init(service: String = "io.mpush.sdk", account: String = "ticket") {
        self.service = service
        self.account = account
    }

    public func load() throws -> String? {
        var query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: service,
            kSecAttrAccount as String: account,
            kSecReturnData as String: true,
        ]
        query[kSecMatchLimit as String] = kSecMatchLimitOne
        var out: AnyObject?
        let status = SecItemCopyMatching(query as CFDictionary, &out)
        if status == errSecItemNotFound { return nil }
        guard status == errSecSuccess, let data = out as? Data else {
            throw PushError.Storage(reason: "keychain read failed (\(status))")
        }
        return String(data: data, encoding: .utf8)
    }

    public func save(ticket: String) throws {
        let base: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: service,
            kSecAttrAccount as String: account,
        ]
        SecItemDelete(base as CFDictionary)
        if ticket.isEmpty { return }
        var add = base
        add[kSecValueData as String] = Data(ticket.utf8)
        add[kSecAttrAccessible as String] = kSecAttrAccessibleAfterFirstUnlock
        let status = SecItemAdd(add as CFDictionary, nil)
        guard status == errSecSuccess else {
            throw PushError.Storage(reason: "keychain write failed (\(status))")
        }
    }
}
