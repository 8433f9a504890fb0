// Where the operational commands find the store: relay-server's own config loader, so both
// agree on the backend, relative paths (resolved against the config's directory) and the
// RELAY_DB_PATH / RELAY_DB_URL overrides.
import Foundation
import RelayCore

func loadConfig(_ path: String) throws -> RelayConfig {
    do {
        return try RelayConfig.load(path: path)
    } catch let error as ConfigError {
        throw RuntimeFailure("config \(path): \(error)")
    }
}
