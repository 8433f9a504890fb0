// The P-256 curve's EC_GROUP, built once: EC_GROUP_new_by_curve_name allocates and loads the
// curve's parameters on every call.
internal import COpenSSL

/// `@unchecked Sendable`: never modified after init; the EC_POINT functions take the group as
/// `const` and OpenSSL documents concurrent use of a const group as safe (no precomputation is
/// ever stored into it here).
package final class P256Group: @unchecked Sendable {
    package let handle: OpaquePointer

    /// Nil only if OpenSSL cannot build P-256 at all (out of memory at first use).
    package static let shared: P256Group? = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1).map(P256Group.init)

    private init(_ handle: OpaquePointer) { self.handle = handle }
    deinit { EC_GROUP_free(handle) }
}
