// Temporary until RelayCore's config loader lands: reads the storage path from the config.
import Foundation

func databasePath(fromConfig path: String) throws -> String {
    throw RuntimeFailure("reading \(path): config loader not available yet; pass --db <path>")
}
