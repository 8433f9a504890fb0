// The ingest's Authorization rule written the plain way, with Strings: the oracle for the
// byte parser (IngestService.bearerHash) in IngestServiceTests and in Fuzz/IngestFuzz, which
// compiles this file into its binary. No imports: the fuzz build has no TestSupport module.

/// The bearer secret if `authorization` is `Bearer` (any case), one or more spaces, `rk_` +
/// base64url characters (3 to 128 bytes in all), optional trailing spaces/tabs; nil otherwise.
public func referenceBearerSecret(_ authorization: String?) -> String? {
    guard let a = authorization else { return nil }
    var rest = Substring(a).drop { $0 == " " }
    guard rest.utf8.count > 6, String(rest.prefix(6)).lowercased() == "bearer" else { return nil }
    rest = rest.dropFirst(6)
    guard rest.first == " " else { return nil }
    rest = rest.drop { $0 == " " || $0 == "\t" }
    while let last = rest.last, last == " " || last == "\t" { rest = rest.dropLast() }
    let allowed = Set("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_".utf8)
    guard rest.hasPrefix("rk_"), (3...128).contains(rest.utf8.count), rest.utf8.allSatisfy(allowed.contains) else { return nil }
    return String(rest)
}
