// Where the operational commands find the database: relay-server's own config loader, so both
// agree on relative paths (resolved against the config's directory) and on RELAY_DB_PATH.
import Foundation
import RelayCore

func loadConfig(_ path: String) throws -> RelayConfig {
    do {
        return try RelayConfig.load(path: path)
    } catch let error as ConfigError {
        throw RuntimeFailure("config \(path): \(error)")
    }
}

func databasePath(fromConfig path: String) throws -> String {
    try loadConfig(path).store.path
}
