"""The PostgreSQL store's schema, as versioned migrations.

Each entry moves the schema one version up (the version is the one row of
`recoveryd_schema`); never edit one, add the next. They are applied at start, in one
transaction under an advisory lock, so replicas starting together migrate once.

The tables are the SQLite store's (see sqlite*.py for what each column means), with
PostgreSQL's types: times are Unix seconds in `double precision`, ids are identities,
and the lists that statements append to or read member by member (a record's history,
calls and batches, a batch's dlqIds) are `jsonb`. Two differences:

* counts by state are kept as deltas (`state_count_deltas`, one row a statement and
  state, appended by statement triggers and folded back by `pipeline.status`), not in
  one row a state as SQLite does: every transaction from every replica would update
  those few rows, queueing behind each other's commits, and deadlocking when two move
  dlqIds between the same states in opposite orders; so are the failure groups' counts
  (`group_count_deltas`, listing.py), for the same reason;
* a pruned dlqId's key is a `bigint` (the same first 8 bytes of its sha256).
"""

from __future__ import annotations

from daemon.store.postgres import listing, replay

# The advisory lock (pg_advisory_xact_lock) under which migrations run: "recoveryd" in ASCII.
MIGRATION_LOCK = 0x7265636F76657279

INITIAL = """
    CREATE TABLE callbacks (
        dlq_id text PRIMARY KEY,
        body bytea NOT NULL,
        received_at double precision NOT NULL,
        state text NOT NULL DEFAULT 'received',
        lease_owner text,
        lease_until double precision,
        tries integer NOT NULL DEFAULT 0,
        sends integer NOT NULL DEFAULT 0,
        reason text,
        rule text,
        action text,
        matched text,
        overrides text,
        workflow_run_id text,
        workflow_key text,
        fingerprint text,
        would text,
        batch_ids jsonb NOT NULL DEFAULT '[]',
        calls jsonb NOT NULL DEFAULT '[]',
        history jsonb NOT NULL DEFAULT '[]',
        decided_at double precision,
        updated_at double precision
    );
    CREATE INDEX callbacks_by_state ON callbacks (state, received_at);
    CREATE INDEX callbacks_claimable ON callbacks (lease_until, received_at)
        WHERE state = 'received';
    CREATE INDEX callbacks_by_update ON callbacks (state, updated_at);
    CREATE INDEX callbacks_by_workflow ON callbacks (workflow_key, decided_at);

    CREATE TABLE state_count_deltas (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        state text NOT NULL,
        n bigint NOT NULL
    );
    CREATE FUNCTION count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO state_count_deltas (state, n)
            SELECT state, count(*) FROM inserted GROUP BY state;
        RETURN NULL;
    END $$;
    CREATE FUNCTION count_updated() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO state_count_deltas (state, n)
            SELECT state, sum(n) FROM (
                SELECT state, count(*) AS n FROM inserted GROUP BY state
                UNION ALL
                SELECT state, -count(*) FROM deleted GROUP BY state
            ) AS moves GROUP BY state HAVING sum(n) <> 0;
        RETURN NULL;
    END $$;
    CREATE FUNCTION count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO state_count_deltas (state, n)
            SELECT state, -count(*) FROM deleted GROUP BY state;
        RETURN NULL;
    END $$;
    CREATE TRIGGER callbacks_count_insert AFTER INSERT ON callbacks
        REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION count_inserted();
    CREATE TRIGGER callbacks_count_update AFTER UPDATE ON callbacks
        REFERENCING OLD TABLE AS deleted NEW TABLE AS inserted
        FOR EACH STATEMENT EXECUTE FUNCTION count_updated();
    CREATE TRIGGER callbacks_count_delete AFTER DELETE ON callbacks
        REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION count_deleted();

    CREATE TABLE batches (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        action text NOT NULL,
        overrides text NOT NULL,
        state text NOT NULL,
        dlq_ids jsonb NOT NULL,
        created_at double precision NOT NULL,
        sent_at double precision,
        settled_at double precision,
        runs jsonb NOT NULL DEFAULT '[]',
        calls jsonb NOT NULL DEFAULT '[]',
        reason text,
        owner text  -- the replica sending or checking it; NULL: anyone's to adopt
    );
    CREATE INDEX batches_by_state ON batches (state);
    CREATE INDEX batches_by_owner ON batches (owner) WHERE state = 'pending';
    -- A replica's leases and decided dlqIds, found when it is declared gone.
    CREATE INDEX callbacks_by_owner ON callbacks (lease_owner) WHERE lease_owner IS NOT NULL;

    -- The replicas at work: each renews `alive_until`; one that lets it pass is gone, and
    -- its work (leases, decided dlqIds, batches) becomes anyone's (replicas.py).
    CREATE TABLE replicas (
        id text PRIMARY KEY,
        started_at double precision NOT NULL,
        seen_at double precision NOT NULL,
        alive_until double precision NOT NULL
    );

    -- The rotated credentials, sealed (Fernet) with RECOVERYD_CREDENTIALS_KEY: one row.
    CREATE TABLE credentials (
        id integer PRIMARY KEY CHECK (id = 1),
        sealed bytea NOT NULL,
        rotation bigint,
        saved_at double precision NOT NULL
    );

    CREATE TABLE recovered_runs (
        run_id text PRIMARY KEY,
        batch_id bigint NOT NULL,
        created_at double precision NOT NULL
    );
    CREATE INDEX recovered_runs_by_batch ON recovered_runs (batch_id);

    CREATE TABLE pruned (key bigint PRIMARY KEY, until double precision NOT NULL);
    CREATE INDEX pruned_by_until ON pruned (until);

    CREATE TABLE rotations (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        started_at double precision NOT NULL,
        finished_at double precision,
        result text,
        reason text,
        resolved_at double precision
    );
    -- One rotation under way at a time, whichever replica began it.
    CREATE UNIQUE INDEX rotations_under_way ON rotations ((true)) WHERE result IS NULL;

    CREATE TABLE notifications (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        dlq_id text NOT NULL REFERENCES callbacks (dlq_id) ON DELETE CASCADE,
        rule text NOT NULL,
        url text NOT NULL,
        receiver text NOT NULL,
        idempotency_key text NOT NULL,
        payload text NOT NULL,
        state text NOT NULL DEFAULT 'pending',
        attempts integer NOT NULL DEFAULT 0,
        next_at double precision NOT NULL,
        queued_at double precision NOT NULL,
        last_attempt_at double precision,
        last_status integer,
        reason text,
        finished_at double precision,
        UNIQUE (dlq_id, rule)
    );
    CREATE INDEX notifications_due ON notifications (next_at) WHERE state = 'pending';

    CREATE TABLE sweep_runs (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        sweep text NOT NULL,
        action text NOT NULL,
        dry_run boolean NOT NULL,
        filter jsonb NOT NULL,
        overrides jsonb,
        max_per_run integer NOT NULL,
        started_at double precision NOT NULL,
        finished_at double precision,
        result text,
        error text,
        pages integer NOT NULL DEFAULT 0,
        workflows integer NOT NULL DEFAULT 0,
        cursor text
    );
    CREATE UNIQUE INDEX sweep_runs_under_way ON sweep_runs (sweep) WHERE result IS NULL;
    CREATE INDEX sweep_runs_by_sweep ON sweep_runs (sweep, id);
    CREATE TABLE sweep_pages (
        run_id bigint NOT NULL REFERENCES sweep_runs (id) ON DELETE CASCADE,
        page integer NOT NULL,
        count integer NOT NULL,
        cursor text,
        sent_at double precision NOT NULL,
        answered_at double precision,
        outcome text NOT NULL,
        next_cursor text,
        items jsonb NOT NULL DEFAULT '[]',
        error text,
        PRIMARY KEY (run_id, page)
    );

    CREATE TABLE endpoint_failures (
        dlq_id text PRIMARY KEY,
        url_group text NOT NULL,
        endpoint text NOT NULL,
        response_status integer,
        failed_at double precision NOT NULL,
        counted_at double precision NOT NULL,
        rule text,
        removal_id bigint
    );
    CREATE INDEX endpoint_failures_open ON endpoint_failures (url_group, endpoint, failed_at)
        WHERE removal_id IS NULL;
    CREATE TABLE endpoint_removals (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        url_group text NOT NULL,
        endpoint text NOT NULL,
        endpoint_name text,
        endpoint_url text,
        rule text NOT NULL,
        threshold_failures integer NOT NULL,
        threshold_within double precision NOT NULL,
        keep_last integer NOT NULL,
        dlq_id text NOT NULL,
        state text NOT NULL,
        reason text,
        evidence jsonb NOT NULL DEFAULT '[]',
        tries integer NOT NULL DEFAULT 0,
        retry_at double precision,
        calls jsonb NOT NULL DEFAULT '[]',
        created_at double precision NOT NULL,
        intended_at double precision,
        finished_at double precision,
        restore_state text,
        restore_reason text,
        restored_at double precision,
        updated_at double precision NOT NULL
    );
    CREATE INDEX endpoint_removals_open ON endpoint_removals (state, id)
        WHERE state IN ('pending', 'removing');
    CREATE INDEX endpoint_removals_by_endpoint ON endpoint_removals (url_group, endpoint);
    CREATE INDEX endpoint_removals_by_intent ON endpoint_removals (intended_at);
"""

# Migration 2: whether the callback's signature verified; earlier rows count as not, so
# that RECOVERYD_FETCH=needed reads their DLQ messages as before.
VERIFIED = """
    ALTER TABLE callbacks ADD COLUMN verified boolean NOT NULL DEFAULT false;
"""

# Migration 3: the final answers (a 400...) a dlqId's reads got, apart from its tries: an
# outage's transient failures count as tries, and must not bring it nearer to `failed`.
# Rows from before it start at 0: their tries cannot be told apart, and starting over
# can only give a dlqId up to five more final answers, never fail one early.
REFUSALS = """
    ALTER TABLE callbacks ADD COLUMN refusals integer NOT NULL DEFAULT 0;
"""
# Migration 4: whether a received dlqId's backoff waits for the service (a transient
# failure) rather than for itself; the service's return ends the first (`retry_now`).
# Rows from before it wait out their backoff, as they did.
WAITS_FOR_SERVICE = """
    ALTER TABLE callbacks ADD COLUMN waits_for_service boolean NOT NULL DEFAULT false;
"""

# Migration 5: the account's rate limit as last learned, and how (postgres/rate.py): every
# replica reads it, so that the limit is discovered once per account, not per process.
LEARNED_RATE = """
    CREATE TABLE learned_rate (
        id integer PRIMARY KEY CHECK (id = 1),
        rate double precision NOT NULL,
        source text NOT NULL,
        learned_at double precision NOT NULL,
        replica text
    );
"""

MIGRATIONS: tuple[str, ...] = (
    INITIAL,
    VERIFIED,
    REFUSALS,
    WAITS_FOR_SERVICE,
    LEARNED_RATE,
    listing.SCHEMA,  # migration 6: the console's listings
    replay.SCHEMA,  # migration 7: the facts decisions keep, and the shadow's decisions
)
