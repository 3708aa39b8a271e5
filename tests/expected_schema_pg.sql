-- columns
bounce_key | id | bigint | NO | NULL | NO | NULL
bounce_key | secret | text | NO | NULL | NO | NULL
bounce_key | created_at | double precision | NO | NULL | NO | NULL
bounces | message_ref | text | NO | NULL | NO | NULL
bounces | outbox_id | bigint | NO | NULL | NO | NULL
bounces | case_key | text | NO | NULL | NO | NULL
bounces | recipient | text | NO | NULL | NO | NULL
bounces | status | text | NO | NULL | NO | NULL
bounces | diagnostic | text | YES | NULL | NO | NULL
bounces | remote_mta | text | YES | NULL | NO | NULL
bounces | permanent | bigint | NO | NULL | NO | NULL
bounces | at | double precision | NO | NULL | NO | NULL
case_counters | domain | text | YES | NULL | NO | NULL
case_counters | type | text | YES | NULL | NO | NULL
case_counters | next_n | bigint | YES | NULL | NO | NULL
cases | key | text | NO | NULL | NO | NULL
cases | address | text | NO | NULL | NO | NULL
cases | domain | text | NO | NULL | NO | NULL
cases | type | text | NO | NULL | NO | NULL
cases | id | text | NO | NULL | NO | NULL
cases | role | text | NO | NULL | NO | NULL
cases | participant | text | YES | NULL | NO | NULL
cases | created_at | double precision | NO | NULL | NO | NULL
cases | policy | text | YES | NULL | NO | NULL
cases | thread_seq | bigint | NO | 0 | NO | NULL
cases | sent_count | bigint | NO | 0 | NO | NULL
cases | thread_xid | xid8 | YES | NULL | NO | NULL
deliveries | dedupe | text | NO | NULL | NO | NULL
deliveries | message_ref | text | NO | NULL | NO | NULL
deliveries | at | double precision | NO | NULL | NO | NULL
handoffs | handoff_id | text | NO | NULL | NO | NULL
handoffs | case_key | text | NO | NULL | NO | NULL
handoffs | mode | text | NO | NULL | NO | NULL
handoffs | peer | text | YES | NULL | NO | NULL
handoffs | status | text | NO | NULL | NO | NULL
handoffs | last_seq | bigint | YES | NULL | NO | NULL
handoffs | requested_at | double precision | NO | NULL | NO | NULL
handoffs | deadline_at | double precision | YES | NULL | NO | NULL
handoffs | closed_at | double precision | YES | NULL | NO | NULL
handoffs | forwarded | bigint | NO | 0 | NO | NULL
handoffs | webhook_url | text | YES | NULL | NO | NULL
handoffs | details | text | NO | '{}'::text | NO | NULL
id_counters | domain | text | NO | NULL | NO | NULL
id_counters | type | text | NO | NULL | NO | NULL
id_counters | next_n | bigint | NO | NULL | NO | NULL
idempotency | peer | text | NO | NULL | NO | NULL
idempotency | id | text | NO | NULL | NO | NULL
idempotency | status | bigint | NO | NULL | NO | NULL
idempotency | body | text | NO | NULL | NO | NULL
idempotency | at | double precision | NO | NULL | NO | NULL
intakes | intake_ref | text | NO | NULL | NO | NULL
intakes | domain | text | NO | NULL | NO | NULL
intakes | type | text | NO | NULL | NO | NULL
intakes | message_ref | text | NO | NULL | NO | NULL
intakes | requested_mode | text | YES | NULL | NO | NULL
intakes | case_key | text | YES | NULL | NO | NULL
intakes | created_at | double precision | NO | NULL | NO | NULL
intakes | assigned_at | double precision | YES | NULL | NO | NULL
masd_migrations | version | bigint | NO | NULL | NO | NULL
masd_migrations | name | text | NO | NULL | NO | NULL
masd_migrations | applied_at | double precision | NO | NULL | NO | NULL
messages | message_ref | text | NO | NULL | NO | NULL
messages | case_key | text | YES | NULL | NO | NULL
messages | intake_ref | text | YES | NULL | NO | NULL
messages | rcpt_to | text | NO | NULL | NO | NULL
messages | mail_from | text | NO | NULL | NO | NULL
messages | message_id | text | YES | NULL | NO | NULL
messages | from_address | text | YES | NULL | NO | NULL
messages | sha256 | text | NO | NULL | NO | NULL
messages | size | bigint | NO | NULL | NO | NULL
messages | raw | bytea | NO | NULL | NO | NULL
messages | event | text | NO | NULL | NO | NULL
messages | received_at | double precision | NO | NULL | NO | NULL
outbox | id | bigint | NO | NULL | YES | BY DEFAULT
outbox | kind | text | NO | NULL | NO | NULL
outbox | queue | text | NO | NULL | NO | NULL
outbox | peer | text | YES | NULL | NO | NULL
outbox | case_key | text | YES | NULL | NO | NULL
outbox | url | text | YES | NULL | NO | NULL
outbox | payload | text | NO | NULL | NO | NULL
outbox | created_at | double precision | NO | NULL | NO | NULL
outbox | next_attempt_at | double precision | NO | NULL | NO | NULL
outbox | attempts | bigint | NO | 0 | NO | NULL
outbox | last_error | text | YES | NULL | NO | NULL
outbox | state | text | NO | 'pending'::text | NO | NULL
outbox | deliver_until | double precision | NO | NULL | NO | NULL
outbox | claimed_by | text | YES | NULL | NO | NULL
outbox | claimed_until | double precision | YES | NULL | NO | NULL
outbox | done_at | double precision | YES | NULL | NO | NULL
outbox_sent | id | bigint | NO | NULL | NO | NULL
outbox_sent | attempts | bigint | NO | NULL | NO | NULL
outbox_sent | done_at | double precision | YES | NULL | NO | NULL
send_log | id | bigint | NO | NULL | YES | BY DEFAULT
send_log | case_key | text | NO | NULL | NO | NULL
send_log | recipient | text | NO | NULL | NO | NULL
send_log | at | double precision | NO | NULL | NO | NULL
statuses | handoff_id | text | NO | NULL | NO | NULL
statuses | n | bigint | NO | NULL | NO | NULL
statuses | seq | bigint | YES | NULL | NO | NULL
statuses | status | text | NO | NULL | NO | NULL
statuses | source | text | NO | NULL | NO | NULL
statuses | data | text | NO | '{}'::text | NO | NULL
statuses | at | double precision | NO | NULL | NO | NULL
suppressions | address | text | NO | NULL | NO | NULL
suppressions | until | double precision | NO | NULL | NO | NULL
suppressions | status | text | NO | NULL | NO | NULL
suppressions | case_key | text | NO | NULL | NO | NULL
suppressions | message_ref | text | NO | NULL | NO | NULL
suppressions | at | double precision | NO | NULL | NO | NULL
thread | case_key | text | NO | NULL | NO | NULL
thread | seq | bigint | NO | NULL | NO | NULL
thread | kind | text | NO | NULL | NO | NULL
thread | at | double precision | NO | NULL | NO | NULL
thread | data | text | NO | '{}'::text | NO | NULL
thread | pos | bigint | NO | masd_thread_pos() | NO | NULL
thread | xid | xid8 | NO | pg_current_xact_id() | NO | NULL

-- constraints
bounce_key | bounce_key_id_check | CHECK ((id = 1))
bounce_key | bounce_key_pkey | PRIMARY KEY (id)
bounces | bounces_permanent_check | CHECK ((permanent = ANY (ARRAY[(0)::bigint, (1)::bigint])))
bounces | bounces_pkey | PRIMARY KEY (message_ref)
cases | cases_address_key | UNIQUE (address)
cases | cases_pkey | PRIMARY KEY (key)
cases | cases_policy_check | CHECK (((policy IS NULL) OR ((policy)::json IS NOT NULL)))
cases | cases_role_check | CHECK ((role = ANY (ARRAY['master'::text, 'slave'::text])))
cases | cases_sent_count_check | CHECK ((sent_count >= 0))
cases | cases_thread_seq_check | CHECK ((thread_seq >= 0))
deliveries | deliveries_pkey | PRIMARY KEY (dedupe)
handoffs | handoffs_case_key_fkey | FOREIGN KEY (case_key) REFERENCES cases(key)
handoffs | handoffs_details_check | CHECK (((details)::json IS NOT NULL))
handoffs | handoffs_forwarded_check | CHECK ((forwarded = ANY (ARRAY[(0)::bigint, (1)::bigint])))
handoffs | handoffs_pkey | PRIMARY KEY (handoff_id)
handoffs | handoffs_status_check | CHECK ((status = ANY (ARRAY['requested'::text, 'negotiating'::text, 'scheduled'::text, 'attempted'::text, 'running'::text, 'completed'::text, 'failed'::text, 'expired'::text, 'refused'::text, 'cancelled'::text, 'timed-out'::text])))
id_counters | id_counters_next_n_check | CHECK ((next_n >= 1))
id_counters | id_counters_pkey | PRIMARY KEY (domain, type)
idempotency | idempotency_pkey | PRIMARY KEY (peer, id)
intakes | intakes_case_key_fkey | FOREIGN KEY (case_key) REFERENCES cases(key)
intakes | intakes_check | CHECK (((case_key IS NULL) = (assigned_at IS NULL)))
intakes | intakes_pkey | PRIMARY KEY (intake_ref)
masd_migrations | masd_migrations_pkey | PRIMARY KEY (version)
messages | messages_case_key_fkey | FOREIGN KEY (case_key) REFERENCES cases(key)
messages | messages_event_check | CHECK (((event)::json IS NOT NULL))
messages | messages_pkey | PRIMARY KEY (message_ref)
messages | messages_size_check | CHECK ((size >= 0))
outbox | outbox_attempts_check | CHECK ((attempts >= 0))
outbox | outbox_check | CHECK (((claimed_by IS NULL) = (claimed_until IS NULL)))
outbox | outbox_kind_check | CHECK ((kind = ANY (ARRAY['contract'::text, 'mail'::text])))
outbox | outbox_pkey | PRIMARY KEY (id)
outbox | outbox_state_check | CHECK ((state = ANY (ARRAY['pending'::text, 'done'::text, 'failed'::text, 'abandoned'::text])))
outbox_sent | outbox_sent_attempts_check | CHECK ((attempts >= 0))
outbox_sent | outbox_sent_pkey | PRIMARY KEY (id)
send_log | send_log_pkey | PRIMARY KEY (id)
statuses | statuses_data_check | CHECK (((data)::json IS NOT NULL))
statuses | statuses_handoff_id_fkey | FOREIGN KEY (handoff_id) REFERENCES handoffs(handoff_id)
statuses | statuses_n_check | CHECK ((n >= 1))
statuses | statuses_pkey | PRIMARY KEY (handoff_id, n)
statuses | statuses_source_check | CHECK ((source = ANY (ARRAY['email'::text, 'mode'::text, 'master'::text])))
statuses | statuses_status_check | CHECK ((status = ANY (ARRAY['requested'::text, 'negotiating'::text, 'scheduled'::text, 'attempted'::text, 'running'::text, 'completed'::text, 'failed'::text, 'expired'::text, 'refused'::text, 'cancelled'::text, 'timed-out'::text])))
suppressions | suppressions_pkey | PRIMARY KEY (address)
thread | thread_case_key_seq_key | UNIQUE (case_key, seq)
thread | thread_data_check | CHECK (((data)::json IS NOT NULL))
thread | thread_kind_check | CHECK ((kind = ANY (ARRAY['case.erased'::text, 'contract.in'::text, 'contract.out'::text, 'delivery.failed'::text, 'mail.bounced'::text, 'mail.in'::text, 'mail.out'::text, 'mail.refused'::text, 'status'::text])))
thread | thread_pkey | PRIMARY KEY (pos)
thread | thread_seq_check | CHECK ((seq >= 1))

-- indexes
bounce_key | bounce_key_pkey | CREATE UNIQUE INDEX bounce_key_pkey ON public.bounce_key USING btree (id)
bounces | bounces_outbox | CREATE INDEX bounces_outbox ON public.bounces USING btree (outbox_id)
bounces | bounces_pkey | CREATE UNIQUE INDEX bounces_pkey ON public.bounces USING btree (message_ref)
cases | cases_address_key | CREATE UNIQUE INDEX cases_address_key ON public.cases USING btree (address)
cases | cases_domain_type | CREATE INDEX cases_domain_type ON public.cases USING btree (domain, type)
cases | cases_pkey | CREATE UNIQUE INDEX cases_pkey ON public.cases USING btree (key)
deliveries | deliveries_at | CREATE INDEX deliveries_at ON public.deliveries USING btree (at)
deliveries | deliveries_pkey | CREATE UNIQUE INDEX deliveries_pkey ON public.deliveries USING btree (dedupe)
handoffs | handoffs_case | CREATE INDEX handoffs_case ON public.handoffs USING btree (case_key, requested_at)
handoffs | handoffs_open_deadline | CREATE INDEX handoffs_open_deadline ON public.handoffs USING btree (deadline_at) WHERE (closed_at IS NULL)
handoffs | handoffs_pkey | CREATE UNIQUE INDEX handoffs_pkey ON public.handoffs USING btree (handoff_id)
id_counters | id_counters_pkey | CREATE UNIQUE INDEX id_counters_pkey ON public.id_counters USING btree (domain, type)
idempotency | idempotency_at | CREATE INDEX idempotency_at ON public.idempotency USING btree (at)
idempotency | idempotency_pkey | CREATE UNIQUE INDEX idempotency_pkey ON public.idempotency USING btree (peer, id)
intakes | intakes_case | CREATE INDEX intakes_case ON public.intakes USING btree (case_key) WHERE (case_key IS NOT NULL)
intakes | intakes_pending | CREATE INDEX intakes_pending ON public.intakes USING btree (domain, type, created_at) WHERE (case_key IS NULL)
intakes | intakes_pkey | CREATE UNIQUE INDEX intakes_pkey ON public.intakes USING btree (intake_ref)
masd_migrations | masd_migrations_pkey | CREATE UNIQUE INDEX masd_migrations_pkey ON public.masd_migrations USING btree (version)
messages | messages_case | CREATE INDEX messages_case ON public.messages USING btree (case_key, received_at)
messages | messages_intake | CREATE INDEX messages_intake ON public.messages USING btree (intake_ref) WHERE (intake_ref IS NOT NULL)
messages | messages_pkey | CREATE UNIQUE INDEX messages_pkey ON public.messages USING btree (message_ref)
outbox | outbox_claims | CREATE INDEX outbox_claims ON public.outbox USING btree (claimed_until) WHERE (claimed_by IS NOT NULL)
outbox | outbox_due | CREATE INDEX outbox_due ON public.outbox USING btree (state, next_attempt_at)
outbox | outbox_pkey | CREATE UNIQUE INDEX outbox_pkey ON public.outbox USING btree (id)
outbox | outbox_queue | CREATE INDEX outbox_queue ON public.outbox USING btree (queue, id) WHERE (state = 'pending'::text)
outbox_sent | outbox_sent_pkey | CREATE UNIQUE INDEX outbox_sent_pkey ON public.outbox_sent USING btree (id)
send_log | send_log_pkey | CREATE UNIQUE INDEX send_log_pkey ON public.send_log USING btree (id)
send_log | send_log_recipient | CREATE INDEX send_log_recipient ON public.send_log USING btree (recipient, at)
statuses | statuses_pkey | CREATE UNIQUE INDEX statuses_pkey ON public.statuses USING btree (handoff_id, n)
suppressions | suppressions_pkey | CREATE UNIQUE INDEX suppressions_pkey ON public.suppressions USING btree (address)
thread | thread_case_key_seq_key | CREATE UNIQUE INDEX thread_case_key_seq_key ON public.thread USING btree (case_key, seq)
thread | thread_pkey | CREATE UNIQUE INDEX thread_pkey ON public.thread USING btree (pos)

-- triggers
outbox | outbox_sent_kept | CREATE TRIGGER outbox_sent_kept AFTER DELETE ON public.outbox FOR EACH ROW WHEN (((old.state = 'done'::text) AND (old.case_key IS NOT NULL))) EXECUTE FUNCTION outbox_sent_kept()

-- functions
masd_case_number | CREATE OR REPLACE FUNCTION public.masd_case_number(d text, t text)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    name TEXT := 'case_number_' || md5(d || chr(31) || t);
BEGIN
    IF to_regclass(name) IS NULL THEN
        INSERT INTO id_counters (domain, type, next_n) VALUES (d, t, 1)
            ON CONFLICT (domain, type) DO NOTHING;
        EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I START WITH %s', name,
            (SELECT next_n FROM id_counters WHERE domain = d AND type = t));
    END IF;
    RETURN nextval(name);
END
$function$

masd_raced | CREATE OR REPLACE FUNCTION public.masd_raced(what text)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'serialization_failure', MESSAGE = what;
END
$function$

masd_thread_pos | CREATE OR REPLACE FUNCTION public.masd_thread_pos()
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    n BIGINT := COALESCE(NULLIF(current_setting('masd.thread_n', true), ''), '0')::bigint;
BEGIN
    IF n >= 1048576 THEN
        RAISE EXCEPTION 'more than 1048576 thread entries in one transaction';
    END IF;
    PERFORM set_config('masd.thread_n', (n + 1)::text, true);
    RETURN pg_current_xact_id()::text::bigint * 1048576 + n;
END
$function$

outbox_sent_kept | CREATE OR REPLACE FUNCTION public.outbox_sent_kept()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO outbox_sent (id, attempts, done_at)
        VALUES (old.id, old.attempts, old.done_at)
        ON CONFLICT (id) DO UPDATE SET attempts = excluded.attempts, done_at = excluded.done_at;
    RETURN old;
END
$function$


