// PushClient itself needs only FoundationEssentials (Date, UUID, Data, JSONDecoder). This one
// `import Foundation` stays because RelayCore currently reaches Foundation-only String APIs
// (trimmingCharacters, replacingOccurrences, range(of:), CharacterSet, String(format:)) in
// PushClientTransport, Validation, PostgresConnection, Crypto and Metrics through this module's
// import (Swift's transitive member visibility, without MemberImportVisibility). Delete this
// file once those RelayCore files import what they use; nothing in PushClient depends on it.
import Foundation
