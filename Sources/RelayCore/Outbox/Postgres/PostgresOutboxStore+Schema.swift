// PostgresOutboxStore: the schema migrations, run under an advisory lock, and the pending count.
import FoundationEssentials
import Glibc
import Synchronization

extension PostgresOutboxStore {
    /// Index i is the migration to version i+1. Each backend numbers its own migrations: this
    /// v1 creates what SQLite reached in five steps (its v2-v5 changed only SQLite storage: the
    /// pending counter, CHECK and index forms, the id_high row key), and v2 is SQLite's v7 (the
    /// app in the dedupe key), so version numbers are not comparable across backends. Both hold the same tables and columns; PostgreSQL adds the
    /// lease columns and partial indexes for the claim (StoreContractTests compare them).
    static let migrations: [String] = [
        // v1
        """
        CREATE TABLE responses (
            id text PRIMARY KEY,
            app text NOT NULL,
            push_token text NOT NULL,
            session_id text NOT NULL,
            key_id bytea NOT NULL,
            message_index bigint NOT NULL,
            encrypted_data bytea NOT NULL,
            credential_id text NOT NULL,
            state text NOT NULL CHECK (state IN ('queued','inflight','retry','delivered','failed')),
            attempts bigint NOT NULL DEFAULT 0,
            next_attempt_at bigint NOT NULL,
            created_at bigint NOT NULL,
            expires_at bigint NOT NULL,
            last_status bigint,
            last_reason text,
            updated_at bigint NOT NULL,
            lease_owner text,
            lease_expires_at bigint,
            UNIQUE (push_token, session_id, key_id, message_index)
        );
        CREATE INDEX responses_due ON responses (next_attempt_at) WHERE state IN ('queued','retry');
        CREATE INDEX responses_lease ON responses (lease_expires_at) WHERE state = 'inflight';
        CREATE INDEX responses_updated ON responses (state, updated_at);
        CREATE TABLE attempts (
            id bigserial PRIMARY KEY,
            response_id text NOT NULL,
            attempted_at bigint NOT NULL,
            status bigint,
            reason text,
            apns_timestamp bigint,
            latency_us bigint,
            node text
        );
        CREATE INDEX attempts_response ON attempts (response_id, id);
        CREATE TABLE credentials (
            id text PRIMARY KEY,
            name text NOT NULL,
            hash bytea NOT NULL UNIQUE,
            apps text NOT NULL,
            created_at bigint NOT NULL,
            last_used_at bigint,
            revoked_at bigint
        );
        CREATE TABLE unregistered_tokens (
            token text PRIMARY KEY,
            apns_timestamp bigint NOT NULL,
            recorded_at bigint NOT NULL
        );
        CREATE TABLE token_pacing (
            token text PRIMARY KEY,
            paced_until bigint NOT NULL,
            updated_at bigint NOT NULL
        );
        """,
        // v2: the dedupe key takes the app the row was stored for, so tenants sending the same
        // four fields under two apps do not collide. The app goes last: a probe by the four
        // fields is a prefix of the index (the ingest look-up, the unregistered token's newest
        // row). Every v1 row is unique under the wider key, so building it cannot fail; it
        // holds the table's lock while it builds. The old constraint is found by its definition
        // rather than by PostgreSQL's generated name.
        """
        DO $$
        DECLARE c name;
        BEGIN
            FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = 'responses'::regclass AND contype = 'u'
                     AND pg_get_constraintdef(oid) = 'UNIQUE (push_token, session_id, key_id, message_index)' LOOP
                EXECUTE format('ALTER TABLE responses DROP CONSTRAINT %I', c);
            END LOOP;
        END $$;
        ALTER TABLE responses ADD CONSTRAINT responses_dedupe_key UNIQUE (push_token, session_id, key_id, message_index, app);
        """,
        // v3: the token's waiting rows by created_at, for a 410's cutoff (the newest of them)
        // without reading every row of the token (StoreRules.tokenWalkChunk's issue).
        """
        CREATE INDEX responses_token_pending ON responses (push_token, created_at) WHERE state IN ('queued','inflight','retry');
        """,
        // v4: a token mark says why (StoreRules "token marks"): 410 Unregistered / ExpiredToken
        // or 400 BadDeviceToken; every earlier row was a 410's.
        """
        ALTER TABLE unregistered_tokens ADD COLUMN reason text NOT NULL DEFAULT 'Unregistered';
        """,
        // v5: delivery events (docs/events.md), the same tables and columns as SQLite's v9. seq is
        // taken under a transaction-level advisory lock held to COMMIT (PostgresOutboxStore+Events),
        // so on every node seq order is commit order and a feed reader past seq n never misses a
        // later commit with a smaller seq.
        """
        CREATE TABLE events (
            seq bigserial PRIMARY KEY,
            id text NOT NULL UNIQUE,
            type text NOT NULL,
            created_at bigint NOT NULL,
            credential_id text,
            app text NOT NULL,
            push_token text NOT NULL,
            response_id text,
            session_id text,
            key_id bytea,
            message_index bigint,
            state text,
            status bigint,
            reason text,
            attempts bigint,
            accepted_at bigint,
            finished_at bigint,
            unregistered_at bigint
        );
        CREATE INDEX events_credential ON events (credential_id, seq);
        CREATE TABLE webhook_deliveries (
            webhook text NOT NULL,
            seq bigint NOT NULL,
            state text NOT NULL CHECK (state IN ('pending','delivered','dead')),
            attempts bigint NOT NULL DEFAULT 0,
            first_attempt_at bigint,
            next_attempt_at bigint NOT NULL,
            lease_until bigint NOT NULL DEFAULT 0,
            last_error text,
            updated_at bigint NOT NULL,
            PRIMARY KEY (seq, webhook)
        );
        CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (webhook, seq) WHERE state = 'pending';
        """,
        // v6: an exact generation of the credentials table for CredentialCache (SQLite's v10): a
        // counter a statement trigger bumps in the transaction of every change to what the cache
        // copies (insert, delete, truncate, id/hash/apps/revoked_at), whoever writes it.
        // last_used_at, written by ingest, does not bump it (UPDATE OF lists the columns), so
        // ingest never locks the counter's row. The function keeps the search_path it was
        // created under, so a session with another search_path (psql by hand) bumps this
        // schema's counter. The counts and newest created_at it replaces could come back to
        // earlier values (revoke + delete + create with the clock set back). The same change
        // first takes the credentials lock exclusive (credentialsLockKey, 0x52454C4159435244
        // = 5928228328057295428), which every ingest write holds shared: a revocation commits
        // before an insert's re-check of its credential or after that insert's commit (docs/
        // postgres.md "One write transaction"). BEFORE the statement, so it holds no row lock
        // that a waiting ingest needs. Written to run again over itself (a database whose
        // version was set back).
        """
        CREATE TABLE IF NOT EXISTS credential_generation (
            id int PRIMARY KEY CHECK (id = 1),
            generation bigint NOT NULL
        );
        INSERT INTO credential_generation (id, generation) VALUES (1, 1) ON CONFLICT DO NOTHING;
        CREATE OR REPLACE FUNCTION relay_credentials_changed() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
        BEGIN
            UPDATE credential_generation SET generation = generation + 1 WHERE id = 1;
            RETURN NULL;
        END $$;
        DROP TRIGGER IF EXISTS credentials_changed ON credentials;
        DROP TRIGGER IF EXISTS credentials_truncated ON credentials;
        CREATE TRIGGER credentials_changed AFTER INSERT OR DELETE OR UPDATE OF id, hash, apps, revoked_at ON credentials
            FOR EACH STATEMENT EXECUTE FUNCTION relay_credentials_changed();
        CREATE TRIGGER credentials_truncated AFTER TRUNCATE ON credentials
            FOR EACH STATEMENT EXECUTE FUNCTION relay_credentials_changed();
        CREATE OR REPLACE FUNCTION relay_credentials_lock() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(5928228328057295428);
            RETURN NULL;
        END $$;
        DROP TRIGGER IF EXISTS credentials_lock ON credentials;
        DROP TRIGGER IF EXISTS credentials_lock_truncate ON credentials;
        CREATE TRIGGER credentials_lock BEFORE INSERT OR DELETE OR UPDATE OF id, hash, apps, revoked_at ON credentials
            FOR EACH STATEMENT EXECUTE FUNCTION relay_credentials_lock();
        CREATE TRIGGER credentials_lock_truncate BEFORE TRUNCATE ON credentials
            FOR EACH STATEMENT EXECUTE FUNCTION relay_credentials_lock();
        """,
        // v7: the lease epoch, bumped by every claim of the row; an outcome is written only for
        // the owner and epoch it was claimed under, so a push that outlived its lease never
        // lands on a newer lease of the same row, even one the same node took (docs/postgres.md
        // "Dispatch across nodes: leases"). A constant default: no table rewrite.
        """
        ALTER TABLE responses ADD COLUMN IF NOT EXISTS lease_epoch bigint NOT NULL DEFAULT 0;
        """,
        // v8: a webhook delivery's claim generation (SQLite's v11): every claim and every replay
        // bumps it, and a result is recorded only under the generation it was claimed with. The
        // pending index leads with the due time, as SQLite's: the claim reads due rows in order.
        """
        ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS claim bigint NOT NULL DEFAULT 0;
        DROP INDEX IF EXISTS webhook_deliveries_pending;
        CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (webhook, next_attempt_at, seq) INCLUDE (lease_until)
            WHERE state = 'pending';
        """,
        // v9 (SQLite's v12): the key that seals the feed's cursors (FeedCursor), one for every
        // node, so a cursor read on one node resumes on another and after a restart; written by
        // the first feed that needs it (feedCursorKey).
        """
        CREATE TABLE IF NOT EXISTS feed_cursor_key (
            id int PRIMARY KEY CHECK (id = 1),
            key bytea NOT NULL
        );
        """,
        // v10 (SQLite's v13): a cursor per webhook instead of a delivery row per event: rows
        // stay as they are (the pending ones are retry rows now), each webhook with rows gets a
        // cursor at the newest event, taken under the events lock so no event commits between.
        """
        SELECT pg_advisory_xact_lock(5928228328057427540);
        CREATE TABLE IF NOT EXISTS webhook_cursors (
            webhook text PRIMARY KEY,
            seq bigint NOT NULL,
            claimed_through bigint NOT NULL,
            start_seq bigint NOT NULL,
            epoch bigint NOT NULL DEFAULT 0,
            lease_until bigint NOT NULL DEFAULT 0,
            types text,
            apps text
        );
        INSERT INTO webhook_cursors (webhook, seq, claimed_through, start_seq)
            SELECT w.webhook, m.m, m.m, m.m FROM (SELECT DISTINCT webhook FROM webhook_deliveries) w, (SELECT coalesce(max(seq), 0) AS m FROM events) m
            ON CONFLICT (webhook) DO NOTHING;
        """,
    ]

    static func schemaVersion(_ c: PostgresConnection) throws -> Int {
        let exists = try c.query("SELECT to_regclass('relay_schema_version') IS NOT NULL").first?.first?.bool ?? false
        guard exists else { return 0 }
        return Int(try c.query("SELECT max(version) FROM relay_schema_version").first?.first?.int ?? 0)
    }

    /// Throws unless the database is at exactly this relay's schema version.
    static func requireSchemaVersion(_ c: PostgresConnection) throws {
        let v = try schemaVersion(c)
        guard v == schemaVersion else {
            throw StoreError.invalid("database has schema version \(v), this relay expects \(schemaVersion)"
                + (v < schemaVersion ? " (start relay-server once to migrate)" : " (another node runs a newer relay: upgrade this one)"))
        }
    }

    /// Applies every migration above the stored version, each in its own transaction, while
    /// holding a session advisory lock: nodes starting together migrate one after the other
    /// (the later ones find nothing to do). Refuses a database written by a newer relay.
    static func migrate(_ c: PostgresConnection) throws {
        try c.query("SELECT pg_advisory_lock($1)", [.int(migrationLockKey)])
        defer { _ = try? c.query("SELECT pg_advisory_unlock($1)", [.int(migrationLockKey)]) }
        try c.execute("CREATE TABLE IF NOT EXISTS relay_schema_version (version bigint NOT NULL)")
        let current = try schemaVersion(c)
        guard current <= migrations.count else {
            throw StoreError.invalid("database schema version \(current) is newer than this relay (\(migrations.count))")
        }
        for v in current..<migrations.count {
            do {
                try c.execute("BEGIN")
                try c.execute(migrations[v])
                try c.execute("DELETE FROM relay_schema_version")
                try c.query("INSERT INTO relay_schema_version (version) VALUES ($1)", [.int(Int64(v + 1))])
                try c.execute("COMMIT")
            } catch {
                if c.isOK && !c.isIdle { try? c.execute("ROLLBACK") }
                throw error
            }
        }
    }

    static func countPending(_ c: PostgresConnection) throws -> Int {
        Int(try c.query("SELECT count(*) FROM responses WHERE state IN ('queued','inflight','retry')").first?.first?.int ?? 0)
    }
}
