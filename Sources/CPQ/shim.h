// libpq (PostgreSQL 15 client) from Debian 12 apt. Only Sources/RelayCore/Outbox/Postgres/PostgresConnection.swift
// sees this module; see ../shared/INTEROP.md.
#ifndef CPQ_SHIM_H
#define CPQ_SHIM_H
#include <libpq-fe.h>

// PQsetNoticeProcessor's default prints server NOTICEs (e.g. "relation already exists, skipping"
// from CREATE ... IF NOT EXISTS) straight to stderr, which would break relay-server's JSON-lines
// log. A C function pointer that ignores them is simpler than a capture-free Swift closure.
static inline void cpq_ignore_notice(void *arg, const char *message) { (void)arg; (void)message; }
static inline void cpq_silence_notices(PGconn *conn) { PQsetNoticeProcessor(conn, cpq_ignore_notice, 0); }

// PG_DIAG_SQLSTATE is a character-constant macro ('C'); Swift does not import it reliably.
static inline int cpq_diag_sqlstate(void) { return PG_DIAG_SQLSTATE; }

#endif
