// MockAPNs: an APNs look-alike for tests, benchmarks and users' own tests (issue 4).
// Data path: HTTP/2 request -> RequestValidation -> faults -> verification (ratchet) ->
// DeliveryRecorder -> APNs-shaped answer. Control port: ControlAPI.
