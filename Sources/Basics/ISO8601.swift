// Times as text: RFC 3339 in UTC with milliseconds, the relay's logs and API bodies and the
// mock's delivery records.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `2026-11-30T06:10:00.123Z` for milliseconds since 1970: RFC 3339 in UTC with milliseconds,
/// the format of every time in logs and API bodies. Pure arithmetic into one 24-byte string
/// (days to civil date as in Howard Hinnant's `civil_from_days`): no gmtime_r (glibc takes its
/// time-zone lock even for UTC), no Foundation formatter, no intermediate strings; years outside
/// 0000-9999 (never a relay time) keep the general path.
public func iso8601UTC(millis: Int64) -> String {
    let fraction = Int(((millis % 1000) + 1000) % 1000)
    let seconds = (millis - Int64(fraction)) / 1000
    let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
    let secondOfDay = Int(seconds - days * 86_400)
    let z = days + 719_468
    let era = (z >= 0 ? z : z - 146_096) / 146_097
    let dayOfEra = z - era * 146_097
    let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
    let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
    let mp = (5 * dayOfYear + 2) / 153
    let day = Int(dayOfYear - (153 * mp + 2) / 5 + 1)
    let month = Int(mp < 10 ? mp + 3 : mp - 9)
    let year = Int(yearOfEra + era * 400 + (month <= 2 ? 1 : 0))
    guard (0...9999).contains(year) else { return iso8601UTCGeneral(millis: millis) }
    return String(unsafeUninitializedCapacity: 24) { out in
        func put(_ value: Int, _ width: Int, at index: Int) {
            var v = value
            for k in stride(from: index + width - 1, through: index, by: -1) {
                out[k] = UInt8(truncatingIfNeeded: 0x30 + v % 10)
                v /= 10
            }
        }
        put(year, 4, at: 0); out[4] = 0x2D
        put(month, 2, at: 5); out[7] = 0x2D
        put(day, 2, at: 8); out[10] = 0x54
        put(secondOfDay / 3600, 2, at: 11); out[13] = 0x3A
        put(secondOfDay / 60 % 60, 2, at: 14); out[16] = 0x3A
        put(secondOfDay % 60, 2, at: 17); out[19] = 0x2E
        put(fraction, 3, at: 20); out[23] = 0x5A
        return 24
    }
}

/// The same text through gmtime_r, for any year (`iso8601UTC`'s fallback, and its reference in
/// the tests).
public func iso8601UTCGeneral(millis: Int64) -> String {
    var seconds = time_t(millis >= 0 ? millis / 1000 : (millis - 999) / 1000)
    let fraction = Int(millis - Int64(seconds) * 1000)
    var t = tm()
    gmtime_r(&seconds, &t)
    func pad(_ v: Int32, _ width: Int) -> String {
        let s = String(v)
        return s.count >= width ? s : String(repeating: "0", count: width - s.count) + s
    }
    return pad(t.tm_year + 1900, 4) + "-" + pad(t.tm_mon + 1, 2) + "-" + pad(t.tm_mday, 2) + "T"
        + pad(t.tm_hour, 2) + ":" + pad(t.tm_min, 2) + ":" + pad(t.tm_sec, 2) + "." + pad(Int32(fraction), 3) + "Z"
}
