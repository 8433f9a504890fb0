// relayctl's state files (they hold keys and ratchet positions) go through Basics.DurableFile.
import Basics
import Foundation

/// DurableFile.replace (mode 0600, no symbolic links), its failure as exit 1.
func replaceFileDurably(_ path: String, _ data: Data) throws {
    do { try DurableFile.replace(path, with: [UInt8](data)) } catch { throw RuntimeFailure("\(error)") }
}
