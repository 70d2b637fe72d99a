import Foundation
import Synchronization
import TokenService

/// Each workspace's list of upstreams as this instance last read it, by the version the token
/// check reads with every request (`TokenGrant.upstreamsVersion`): a list is read from the
/// database once per change, never per request.
final class UpstreamLists: Sendable {
    private let lists = Mutex<[Int64: (version: Int64, upstreams: [WorkspaceUpstream])]>([:])

    /// Whether the grant's workspace has a list this instance has not read at its version.
    func isStale(_ grant: TokenGrant) -> Bool {
        grant.upstreamsVersion != 0 && lists.withLock { $0[grant.workspaceID]?.version } != grant.upstreamsVersion
    }

    /// The grant's workspace's upstreams, read from `store` when this instance holds another
    /// version (nil: it has no list, or it cannot be read: its own upstream alone).
    func upstreams(for grant: TokenGrant, store: (any OrganisationStore)?) throws -> [WorkspaceUpstream]? {
        guard grant.upstreamsVersion != 0 else { return nil }
        if let held = lists.withLock({ $0[grant.workspaceID] }), held.version == grant.upstreamsVersion { return held.upstreams }
        guard let store else { return nil }
        let upstreams = try store.workspaceUpstreams(workspaceID: grant.workspaceID)
        lists.withLock { $0[grant.workspaceID] = (grant.upstreamsVersion, upstreams) }
        return upstreams
    }
}

extension MessagesRelay {
    /// One upstream to try: its label and its row (nil: attestd's default key).
    struct Candidate {
        let label: String
        let key: SealedUpstreamKey?
    }

    /// The grant's workspace's upstreams in the order they are tried: its list by priority, the
    /// ones cooling down after a failure last (tried only when the others fail too); else its
    /// own upstream alone, as before it had a list.
    func candidates(for grant: TokenGrant, store: (any OrganisationStore)?) throws -> [Candidate] {
        guard let list = try upstreamLists.upstreams(for: grant, store: store), !list.isEmpty else {
            return [Candidate(label: WorkspaceUpstream.defaultLabel, key: grant.upstreamKey)]
        }
        let now = UpstreamHealth.now()
        let ordered = WorkspaceUpstream.ordered(list)
        let warm = ordered.filter { !health.isCool(workspace: grant.workspaceID, label: $0.label, at: now) }
        let cool = ordered.filter { health.isCool(workspace: grant.workspaceID, label: $0.label, at: now) }
        // The workspace's own row as the token check read it (the freshest copy of it).
        return (warm + cool).map { Candidate(label: $0.label, key: $0.isDefault ? grant.upstreamKey : $0.key) }
    }
}
