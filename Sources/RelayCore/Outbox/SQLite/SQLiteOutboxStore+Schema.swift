// SQLiteOutboxStore: the schema migrations (PRAGMA user_version) and their runner.
import FoundationEssentials
import Glibc
import POSIXThreads

extension SQLiteOutboxStore {
    static let migrations: [String] = [
        // v1
        """
        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            app TEXT NOT NULL,
            push_token TEXT NOT NULL,
            session_id TEXT NOT NULL,
            key_id BLOB NOT NULL,
            message_index INTEGER NOT NULL,
            encrypted_data BLOB NOT NULL,
            credential_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('queued','inflight','retry','delivered','failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            last_status INTEGER,
            last_reason TEXT,
            updated_at INTEGER NOT NULL,
            UNIQUE (push_token, session_id, key_id, message_index)
        );
        CREATE INDEX responses_claim ON responses (state, next_attempt_at);
        CREATE INDEX responses_updated ON responses (state, updated_at);
        CREATE TABLE attempts (
            id INTEGER PRIMARY KEY,
            response_id TEXT NOT NULL,
            attempted_at INTEGER NOT NULL,
            status INTEGER,
            reason TEXT,
            apns_timestamp INTEGER,
            latency_us INTEGER
        );
        CREATE INDEX attempts_response ON attempts (response_id, id);
        CREATE TABLE credentials (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            hash BLOB NOT NULL UNIQUE,
            apps TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            last_used_at INTEGER,
            revoked_at INTEGER
        );
        CREATE TABLE unregistered_tokens (
            token TEXT PRIMARY KEY,
            apns_timestamp INTEGER NOT NULL,
            recorded_at INTEGER NOT NULL
        );
        CREATE TABLE token_pacing (
            token TEXT PRIMARY KEY,
            paced_until INTEGER NOT NULL,
            updated_at INTEGER NOT NULL
        );
        """,
        // v2: the pending-row counter kept per transaction, so start-up does not count the
        // whole outbox (1M rows: hundreds of milliseconds) to enforce store.maxPending.
        """
        CREATE TABLE outbox_stats (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            pending INTEGER NOT NULL
        );
        INSERT INTO outbox_stats (id, pending)
            SELECT 1, count(*) FROM responses WHERE state IN ('queued','inflight','retry');
        """,
        // v3: a cheaper INSERT per ingest (docs/performance-history.md). The table
        // is rebuilt because SQLite cannot alter a CHECK constraint:
        //  - `state IN (<5 literals>)` made every INSERT/UPDATE build and drop an ephemeral
        //    B-tree to evaluate the CHECK; the same constraint as an OR chain needs none.
        //  - responses_updated only serves purge and "recent outcomes", which ask for terminal
        //    rows: as the partial index responses_done an ingest (queued/inflight) and a claim
        //    no longer touch it.
        // Rows keep their rowid, id and every column; ids minted from now on are time-ordered
        // (UUIDv7), so the id index grows at its right edge instead of at random pages.
        """
        DROP INDEX responses_claim;
        DROP INDEX responses_updated;
        ALTER TABLE responses RENAME TO responses_v2;
        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            app TEXT NOT NULL,
            push_token TEXT NOT NULL,
            session_id TEXT NOT NULL,
            key_id BLOB NOT NULL,
            message_index INTEGER NOT NULL,
            encrypted_data BLOB NOT NULL,
            credential_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state = 'queued' OR state = 'inflight' OR state = 'retry' OR state = 'delivered' OR state = 'failed'),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            last_status INTEGER,
            last_reason TEXT,
            updated_at INTEGER NOT NULL,
            UNIQUE (push_token, session_id, key_id, message_index)
        );
        INSERT INTO responses (rowid, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                               attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at)
            SELECT rowid, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                   attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at
            FROM responses_v2 ORDER BY rowid;
        DROP TABLE responses_v2;
        CREATE INDEX responses_claim ON responses (state, next_attempt_at);
        CREATE INDEX responses_done ON responses (state, updated_at) WHERE state = 'delivered' OR state = 'failed';
        """,
        // v4: responses_claim keeps only rows that can still be claimed or are being sent, so a
        // delivery (inflight -> delivered) only deletes its entry instead of moving it, and the
        // index does not grow with the delivered history. Terminal rows are counted through
        // responses_done. Queries name the state as a literal so the planner can use them.
        """
        DROP INDEX responses_claim;
        CREATE INDEX responses_claim ON responses (state, next_attempt_at) WHERE state = 'queued' OR state = 'inflight' OR state = 'retry';
        """,
        // v5: the id's first 64 bits are the row's key (`id_high`, the rowid), and the `id`
        // primary-key index goes: an ingest INSERT writes three B-trees instead of four, and a
        // lookup by id is a rowid descent (`WHERE id_high = ? AND id = ?`, id_high computed in
        // Swift by UUIDText.high64). UUIDv7 high words (timestamp, version 7, counter) increase
        // in commit order, so rows are appended at the table's right edge; v4 ids (version 4)
        // can never share a high word with a v7 id. The column is declared INTEGER PRIMARY KEY,
        // not left as the bare rowid: VACUUM (and relayctl backup's VACUUM INTO) may renumber
        // the rowids of a table without one, and `sqlite3 .dump` does not write them.
        // relay_id_rowid() is defined by migrate(); it refuses ids that are not UUIDs, and two
        // v4 ids sharing their first 64 bits (~2^-60 per pair) fail the INSERT, which migrate()
        // turns into an error naming them. Rows are copied in key order (appends, full pages).
        """
        DROP INDEX responses_claim;
        DROP INDEX responses_done;
        ALTER TABLE responses RENAME TO responses_v4;
        CREATE TABLE responses (
            id_high INTEGER PRIMARY KEY,
            id TEXT NOT NULL,
            app TEXT NOT NULL,
            push_token TEXT NOT NULL,
            session_id TEXT NOT NULL,
            key_id BLOB NOT NULL,
            message_index INTEGER NOT NULL,
            encrypted_data BLOB NOT NULL,
            credential_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state = 'queued' OR state = 'inflight' OR state = 'retry' OR state = 'delivered' OR state = 'failed'),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            last_status INTEGER,
            last_reason TEXT,
            updated_at INTEGER NOT NULL,
            UNIQUE (push_token, session_id, key_id, message_index)
        );
        INSERT INTO responses (id_high, id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                               attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at)
            SELECT relay_id_rowid(id), id, app, push_token, session_id, key_id, message_index, encrypted_data, credential_id, state,
                   attempts, next_attempt_at, created_at, expires_at, last_status, last_reason, updated_at
            FROM responses_v4 ORDER BY 1;
        DROP TABLE responses_v4;
        CREATE INDEX responses_claim ON responses (state, next_attempt_at) WHERE state = 'queued' OR state = 'inflight' OR state = 'retry';
        CREATE INDEX responses_done ON responses (state, updated_at) WHERE state = 'delivered' OR state = 'failed';
        """,
        // v6: the UNIQUE dedupe index goes (with 1,000 interleaved tokens it put every row of a
        // group commit on its own leaf page). The dedupe key is found through response_keys
        // (h, id_high), h a keyed 64-bit hash of the key whose high half hashes the token, filled
        // in large sorted merges off the ingest commit; keys above merged_through live in the
        // ingesting store's memory (SQLiteOutboxStore+Dedupe). migrate() then draws the hash
        // key and sets both watermarks; v7 fills response_keys for the stored rows.
        """
        DROP INDEX responses_claim;
        DROP INDEX responses_done;
        ALTER TABLE responses RENAME TO responses_v5;
        CREATE TABLE responses (
            id_high INTEGER PRIMARY KEY,
            id TEXT NOT NULL,
            app TEXT NOT NULL,
            push_token TEXT NOT NULL,
            session_id TEXT NOT NULL,
            key_id BLOB NOT NULL,
            message_index INTEGER NOT NULL,
            encrypted_data BLOB NOT NULL,
            credential_id TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state = 'queued' OR state = 'inflight' OR state = 'retry' OR state = 'delivered' OR state = 'failed'),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            last_status INTEGER,
            last_reason TEXT,
            updated_at INTEGER NOT NULL
        );
        INSERT INTO responses SELECT * FROM responses_v5 ORDER BY id_high;
        DROP TABLE responses_v5;
        CREATE INDEX responses_claim ON responses (state, next_attempt_at) WHERE state = 'queued' OR state = 'inflight' OR state = 'retry';
        CREATE INDEX responses_done ON responses (state, updated_at) WHERE state = 'delivered' OR state = 'failed';
        CREATE TABLE response_keys (
            h INTEGER NOT NULL,
            id_high INTEGER NOT NULL,
            PRIMARY KEY (h, id_high)
        ) WITHOUT ROWID;
        ALTER TABLE outbox_stats ADD COLUMN dedupe_key BLOB;
        ALTER TABLE outbox_stats ADD COLUMN minted_through INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE outbox_stats ADD COLUMN merged_through INTEGER NOT NULL DEFAULT 0;
        """,
        // v7: the dedupe key takes the app the row was stored for (tenants sending the same
        // four fields under two apps do not collide), so h changes for every row. migrate()
        // writes every row's key again under the same SipHash key; merged_through moves to
        // minted_through (every row is indexed, no tail).
        """
        DELETE FROM response_keys;
        """,
        // v8: a token mark says why (StoreRules "token marks"): 410 Unregistered / ExpiredToken
        // or 400 BadDeviceToken; every earlier row was a 410's.
        """
        ALTER TABLE unregistered_tokens ADD COLUMN reason TEXT NOT NULL DEFAULT 'Unregistered';
        """,
        // v9: delivery events (docs/events.md). An event is inserted by the transaction that
        // commits its outcome, with a copy of the response's fields (never the sealed box); `seq`
        // is the first 64 bits of its UUIDv7 id, minted by the writer in commit order, so the
        // table is appended at its right edge and the feed pages by rowid (no index by credential:
        // SQLiteOutboxStore.feedScanRows). A webhook's delivery
        // of an event is a row of webhook_deliveries written in the same transaction; only its
        // pending rows are indexed by webhook for the sender's claim (oldest event first); the key
        // (seq, webhook) serves retention, which deletes an event with its deliveries.
        """
        CREATE TABLE events (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL,
            type TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            credential_id TEXT,
            app TEXT NOT NULL,
            push_token TEXT NOT NULL,
            response_id TEXT,
            session_id TEXT,
            key_id BLOB,
            message_index INTEGER,
            state TEXT,
            status INTEGER,
            reason TEXT,
            attempts INTEGER,
            accepted_at INTEGER,
            finished_at INTEGER,
            unregistered_at INTEGER
        );
        CREATE TABLE webhook_deliveries (
            webhook TEXT NOT NULL,
            seq INTEGER NOT NULL,
            state TEXT NOT NULL CHECK (state = 'pending' OR state = 'delivered' OR state = 'dead'),
            attempts INTEGER NOT NULL DEFAULT 0,
            first_attempt_at INTEGER,
            next_attempt_at INTEGER NOT NULL,
            lease_until INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            updated_at INTEGER NOT NULL,
            PRIMARY KEY (seq, webhook)
        ) WITHOUT ROWID;
        CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (webhook, seq) WHERE state = 'pending';
        """,
        // v10: an exact generation of the credentials table for CredentialCache: a counter that
        // triggers bump in the transaction of every change to what the cache copies (insert,
        // delete, id/hash/apps/revoked_at), whoever writes it (relay, relayctl, sqlite3 by
        // hand). last_used_at, written by ingest, does not bump it. The counts and newest
        // created_at it replaces could come back to earlier values (revoke + delete + create
        // with the clock set back) and keep a revoked credential valid in a node's copy.
        // Written to run again over itself (a file whose user_version was set back).
        """
        CREATE TABLE IF NOT EXISTS credential_generation (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            generation INTEGER NOT NULL
        );
        INSERT OR IGNORE INTO credential_generation (id, generation) VALUES (1, 1);
        CREATE TRIGGER IF NOT EXISTS credentials_inserted AFTER INSERT ON credentials
            BEGIN UPDATE credential_generation SET generation = generation + 1 WHERE id = 1; END;
        CREATE TRIGGER IF NOT EXISTS credentials_deleted AFTER DELETE ON credentials
            BEGIN UPDATE credential_generation SET generation = generation + 1 WHERE id = 1; END;
        CREATE TRIGGER IF NOT EXISTS credentials_updated AFTER UPDATE OF id, hash, apps, revoked_at ON credentials
            BEGIN UPDATE credential_generation SET generation = generation + 1 WHERE id = 1; END;
        """,
        // v11: a webhook delivery's claim generation (docs/events.md "The store's side"): every
        // claim and every replay bumps it, and a result is recorded only under the generation
        // it was claimed with, so a late answer to an earlier claim cannot overwrite a later
        // claim's or a replay's state. The pending index leads with the due time: the claim
        // reads the due rows in order and stops at its limit (with (webhook, seq) it walked
        // every pending row not yet due, on the writer thread); lease_until in it skips leased
        // rows without reading them.
        """
        ALTER TABLE webhook_deliveries ADD COLUMN claim INTEGER NOT NULL DEFAULT 0;
        DROP INDEX IF EXISTS webhook_deliveries_pending;
        CREATE INDEX webhook_deliveries_due ON webhook_deliveries (webhook, next_attempt_at, seq, lease_until) WHERE state = 'pending';
        """,
        // v12: the key that seals the feed's cursors (FeedCursor), one for the database so a
        // cursor survives a restart; written by the first feed that needs it (feedCursorKey).
        """
        CREATE TABLE IF NOT EXISTS feed_cursor_key (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            key BLOB NOT NULL
        );
        """,
        // v13: a cursor per webhook instead of a delivery row per event (docs/events.md "The
        // store's side"): an outcome commit writes only its event; the sender reads the events
        // after its webhook's cursor and writes a row only for an event whose attempt failed.
        // The rows there stay as they are (the pending ones are retry rows now); each webhook
        // with rows gets a cursor at the newest event (its rows cover everything before), and
        // the cursor row names the subscription (relayctl reads it; the relay writes it at start).
        """
        CREATE TABLE IF NOT EXISTS webhook_cursors (
            webhook TEXT PRIMARY KEY,
            seq INTEGER NOT NULL,
            claimed_through INTEGER NOT NULL,
            start_seq INTEGER NOT NULL,
            epoch INTEGER NOT NULL DEFAULT 0,
            lease_until INTEGER NOT NULL DEFAULT 0,
            types TEXT,
            apps TEXT
        ) WITHOUT ROWID;
        INSERT OR IGNORE INTO webhook_cursors (webhook, seq, claimed_through, start_seq)
            SELECT w.webhook, m.m, m.m, m.m FROM (SELECT DISTINCT webhook FROM webhook_deliveries) w, (SELECT coalesce(max(seq), 0) AS m FROM events) m;
        """,
    ]

    /// Schema v5's key of a stored id (its first 64 bits), for the migration's copy.
    struct NotAUUID: Error, CustomStringConvertible {
        var id: String
        var description: String {
            "response id '\(id)' is not a UUID: schema v5 keys each row by its id's first 64 bits, and a relay never minted such an id; delete or correct that row, then start again"
        }
    }

    /// Applies every migration above the file's user_version, each in its own transaction.
    /// Refuses a database written by a newer relay.
    static func migrate(_ db: SQLiteDatabase, onSlowStart: (@Sendable (String) -> Void)? = nil,
                        reportEveryMicros: Int64 = 1_000_000, dedupeHash: DedupeHashFunction? = nil) throws {
        try db.defineFunction("relay_id_rowid") { text in
            guard let text else { throw NotAUUID(id: "NULL") }
            guard let high = UUIDText.high64(text) else { throw NotAUUID(id: String(decoding: text.prefix(64), as: UTF8.self)) }
            return high
        }
        try db.transaction {
            let current = Int(try db.scalar("PRAGMA user_version").int ?? 0)
            guard current <= migrations.count else {
                throw StoreError.invalid("database schema version \(current) is newer than this relay (\(migrations.count))")
            }
            for v in current..<migrations.count {
                var lastReport = monotonicMicros()
                let stage = "migrating the database to schema v\(v + 1)"
                try db.withProgress(everySteps: 100_000, {
                    let now = monotonicMicros()
                    guard let onSlowStart, now - lastReport >= reportEveryMicros else { return }
                    lastReport = now
                    onSlowStart(stage)
                }) {
                    do {
                        try db.execute(migrations[v])
                    } catch let error as StoreError where v == 4 && error.isPrimaryKeyConflict {
                        throw try v5KeyClash(db)
                    }
                    if v == 5 { try startDedupeIndex(db) }
                    if v == 6 { try fillDedupeIndex(db, override: dedupeHash) }
                }
                try db.execute("PRAGMA user_version = \(v + 1)")
            }
        }
    }

    /// The v5 copy hit two ids with the same first 64 bits (only random v4 ids can: ~2^-60 per
    /// pair). The INSERT was rolled back, responses_v4 is still there (the transaction rolls
    /// back after this): name the ids so an operator can decide which row to delete.
    private static func v5KeyClash(_ db: SQLiteDatabase) throws -> StoreError {
        let groups = try db.query("""
            SELECT group_concat(id, ', ') FROM responses_v4 GROUP BY relay_id_rowid(id) HAVING count(*) > 1 LIMIT 5
            """).compactMap { $0[0].string }
        return .invalid("schema v5 migration: response ids share their first 64 bits, the row key from v5 on (\(groups.map { "{\($0)}" }.joined(separator: " "))); delete all but one of each group, then start again")
    }
}
