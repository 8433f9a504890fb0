// Wake-ups one thread sends to others, coalesced over a burst of hand-overs. A store's writer
// finishes a batch of requests in a row and each answer goes to an HTTP loop's task queue:
// woken once per answer, the loop drains the queue between two answers (it runs on the other
// core) and every answer costs a wake-up (an eventfd write, an epoll return); woken once at
// the end of the batch, it takes the whole batch at once.
import Glibc

public enum WakeCoalescing {
    /// The wake-ups requested during the current `coalescing` scope of one thread.
    private final class Pending {
        var targets: [(key: ObjectIdentifier, wake: () -> Void)] = []
    }

    private static let slot: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "pthread_key_create")
        return key
    }()

    /// Runs `body`; a `wake` requested during it (on this thread) runs once per target, on this
    /// thread, when `body` returns. Nested scopes belong to the outermost one.
    public static func coalescing(_ body: () -> Void) {
        if pthread_getspecific(slot) != nil { return body() }
        let pending = Pending()
        pthread_setspecific(slot, Unmanaged.passUnretained(pending).toOpaque())
        body()
        pthread_setspecific(slot, nil)
        for t in pending.targets { t.wake() }
    }

    /// Outside `coalescing`: runs `wake` now. Inside: once for `target` at the scope's end (a
    /// second request for the same target in the same scope is dropped).
    public static func wake(_ target: AnyObject, _ wake: @escaping () -> Void) {
        guard let raw = pthread_getspecific(slot) else { return wake() }
        let pending = Unmanaged<Pending>.fromOpaque(raw).takeUnretainedValue()
        let key = ObjectIdentifier(target)
        if pending.targets.contains(where: { $0.key == key }) { return }
        pending.targets.append((key, wake))
    }
}
