-- table bounce_key
CREATE TABLE bounce_key (
    id         INTEGER PRIMARY KEY NOT NULL CHECK (id = 1),
    secret     TEXT NOT NULL,
    created_at REAL NOT NULL
) STRICT;

-- table bounces
CREATE TABLE bounces (
    message_ref TEXT PRIMARY KEY NOT NULL,
    outbox_id   INTEGER NOT NULL,
    case_key    TEXT NOT NULL,
    recipient   TEXT NOT NULL,
    status      TEXT NOT NULL,
    diagnostic  TEXT,
    remote_mta  TEXT,
    permanent   INTEGER NOT NULL CHECK (permanent IN (0, 1)),
    at          REAL NOT NULL
) STRICT;

-- index bounces_outbox
CREATE INDEX bounces_outbox ON bounces (outbox_id);

-- table cases
CREATE TABLE cases (
    key         TEXT PRIMARY KEY NOT NULL,
    address     TEXT NOT NULL UNIQUE,
    domain      TEXT NOT NULL,
    type        TEXT NOT NULL,
    id          TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('master', 'slave')),
    participant TEXT,
    created_at  REAL NOT NULL,
    policy      TEXT CHECK (policy IS NULL OR json_valid(policy)),
    thread_seq  INTEGER NOT NULL DEFAULT 0 CHECK (thread_seq >= 0),
    sent_count  INTEGER NOT NULL DEFAULT 0 CHECK (sent_count >= 0)
) STRICT;

-- index cases_domain_type
CREATE INDEX cases_domain_type ON cases (domain, type);

-- table deliveries
CREATE TABLE "deliveries" (
    dedupe      TEXT PRIMARY KEY NOT NULL,
    message_ref TEXT NOT NULL,
    at          REAL NOT NULL
) STRICT, WITHOUT ROWID;

-- index deliveries_at
CREATE INDEX deliveries_at ON deliveries (at);

-- table handoffs
CREATE TABLE handoffs (
    handoff_id   TEXT PRIMARY KEY NOT NULL,
    case_key     TEXT NOT NULL REFERENCES cases (key),
    mode         TEXT NOT NULL,
    peer         TEXT,
    status       TEXT NOT NULL CHECK (status IN ('requested', 'negotiating', 'scheduled', 'attempted', 'running', 'completed', 'failed', 'expired', 'refused', 'cancelled', 'timed-out')),
    last_seq     INTEGER,
    requested_at REAL NOT NULL,
    deadline_at  REAL,
    closed_at    REAL,
    forwarded    INTEGER NOT NULL DEFAULT 0 CHECK (forwarded IN (0, 1)),
    webhook_url  TEXT,
    details      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(details))
) STRICT;

-- index handoffs_case
CREATE INDEX handoffs_case ON handoffs (case_key, requested_at);

-- index handoffs_open_deadline
CREATE INDEX handoffs_open_deadline ON handoffs (deadline_at) WHERE closed_at IS NULL;

-- table id_counters
CREATE TABLE id_counters (
    domain TEXT NOT NULL,
    type   TEXT NOT NULL,
    next_n INTEGER NOT NULL CHECK (next_n >= 1),
    PRIMARY KEY (domain, type)
) STRICT;

-- table idempotency
CREATE TABLE "idempotency" (
    peer   TEXT NOT NULL,
    id     TEXT NOT NULL,
    status INTEGER NOT NULL,
    body   TEXT NOT NULL,
    at     REAL NOT NULL,
    PRIMARY KEY (peer, id)
) STRICT, WITHOUT ROWID;

-- index idempotency_at
CREATE INDEX idempotency_at ON idempotency (at);

-- table intakes
CREATE TABLE intakes (
    intake_ref     TEXT PRIMARY KEY NOT NULL,
    domain         TEXT NOT NULL,
    type           TEXT NOT NULL,
    message_ref    TEXT NOT NULL,
    requested_mode TEXT,
    case_key       TEXT REFERENCES cases (key),
    created_at     REAL NOT NULL,
    assigned_at    REAL,
    CHECK ((case_key IS NULL) = (assigned_at IS NULL))
) STRICT;

-- index intakes_case
CREATE INDEX intakes_case ON intakes (case_key) WHERE case_key IS NOT NULL;

-- index intakes_pending
CREATE INDEX intakes_pending ON intakes (domain, type, created_at) WHERE case_key IS NULL;

-- table masd_migrations
CREATE TABLE masd_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL);

-- table messages
CREATE TABLE "messages" (
    message_ref  TEXT PRIMARY KEY NOT NULL,
    case_key     TEXT REFERENCES cases (key),
    intake_ref   TEXT,
    rcpt_to      TEXT NOT NULL,
    mail_from    TEXT NOT NULL,
    message_id   TEXT,
    from_address TEXT,
    sha256       TEXT NOT NULL,
    size         INTEGER NOT NULL CHECK (size >= 0),
    event        TEXT NOT NULL CHECK (json_valid(event)),
    received_at  REAL NOT NULL,
    raw          BLOB NOT NULL
) STRICT;

-- index messages_case
CREATE INDEX messages_case ON messages (case_key, received_at);

-- index messages_intake
CREATE INDEX messages_intake ON messages (intake_ref) WHERE intake_ref IS NOT NULL;

-- table outbox
CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    kind            TEXT NOT NULL CHECK (kind IN ('contract', 'mail')),
    queue           TEXT NOT NULL,
    peer            TEXT,
    case_key        TEXT,
    url             TEXT,
    payload         ANY NOT NULL,
    created_at      REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error      TEXT,
    state           TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'done', 'failed', 'abandoned')),
    deliver_until   REAL NOT NULL
, done_at REAL) STRICT;

-- index outbox_due
CREATE INDEX outbox_due ON outbox (state, next_attempt_at);

-- index outbox_queue
CREATE INDEX outbox_queue ON outbox (queue, id) WHERE state = 'pending';

-- table outbox_sent
CREATE TABLE outbox_sent (
    id       INTEGER PRIMARY KEY NOT NULL,
    attempts INTEGER NOT NULL CHECK (attempts >= 0),
    done_at  REAL
) STRICT;

-- trigger outbox_sent_kept
CREATE TRIGGER outbox_sent_kept AFTER DELETE ON outbox
    WHEN old.state = 'done' AND old.case_key IS NOT NULL
BEGIN
    INSERT OR REPLACE INTO outbox_sent (id, attempts, done_at)
        VALUES (old.id, old.attempts, old.done_at);
END;

-- table send_log
CREATE TABLE send_log (
    id        INTEGER PRIMARY KEY,
    case_key  TEXT NOT NULL,
    recipient TEXT NOT NULL,
    at        REAL NOT NULL
) STRICT;

-- index send_log_recipient
CREATE INDEX send_log_recipient ON send_log (recipient, at);

-- table statuses
CREATE TABLE "statuses" (
    handoff_id TEXT NOT NULL REFERENCES handoffs (handoff_id),
    n          INTEGER NOT NULL CHECK (n >= 1),
    seq        INTEGER,
    status     TEXT NOT NULL CHECK (status IN ('requested', 'negotiating', 'scheduled', 'attempted', 'running', 'completed', 'failed', 'expired', 'refused', 'cancelled', 'timed-out')),
    source     TEXT NOT NULL CHECK (source IN ('email', 'mode', 'master')),
    data       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    at         REAL NOT NULL,
    PRIMARY KEY (handoff_id, n)
) STRICT, WITHOUT ROWID;

-- table suppressions
CREATE TABLE suppressions (
    address     TEXT PRIMARY KEY NOT NULL,
    until       REAL NOT NULL,
    status      TEXT NOT NULL,
    case_key    TEXT NOT NULL,
    message_ref TEXT NOT NULL,
    at          REAL NOT NULL
) STRICT;

-- table thread
CREATE TABLE "thread" (
    pos      INTEGER PRIMARY KEY,
    case_key TEXT NOT NULL,
    seq      INTEGER NOT NULL CHECK (seq >= 1),
    kind     TEXT NOT NULL CHECK (kind IN ('case.erased', 'contract.in', 'contract.out', 'delivery.failed', 'mail.bounced', 'mail.in', 'mail.out', 'mail.refused', 'status')),
    at       REAL NOT NULL,
    data     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data)),
    UNIQUE (case_key, seq)
) STRICT;

-- trigger thread_seq_kept
CREATE TRIGGER thread_seq_kept AFTER INSERT ON thread
BEGIN
    UPDATE cases SET thread_seq = MAX(thread_seq, NEW.seq) WHERE key = NEW.case_key;
END;

