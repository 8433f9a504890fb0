// Times as text: RFC 3339 in UTC with milliseconds, the relay's logs and API bodies and the
// mock's delivery records.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `2026-11-30T06:10:00.123Z` for milliseconds since 1970: RFC 3339 in UTC with milliseconds,
/// the format of every time in logs and API bodies. gmtime_r instead of a Foundation
/// formatter: no ICU, no allocation besides the result.
public func iso8601UTC(millis: Int64) -> String {
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
