/*
 * The lease protocol of zeroloss, as a Promela model for spin (issue 24).
 *
 * What is modelled (the design issue 24 aims at):
 *   - a ledger of N = 2 accepted messages (one status column each: pending, processing,
 *     completed, dead), their attempts, lease token and lease expiry, and row locks;
 *   - W workers (2 or 3), each a claim/handler thread (`worker`) and a lease keeper (`keeper`):
 *     claim a batch (one or both messages of one queue), run a plain handler (its effect is
 *     outside the database: at-least-once) or a transactional batch (its effects inside one
 *     transaction, committed with the acknowledgements), record the outcomes in one batched,
 *     fenced statement; the keeper renews per row, skipping locked rows, and gives back
 *     claimed messages not started while a handler runs long (released, attempt not counted);
 *     a worker revives a claimed message not started whose lease it believes run out (a claim
 *     whose commit took longer than the lease: statement REVIVE), fenced by the token and the
 *     status, not the expiry, waiting for the row's lock;
 *   - the database clock, which advances by ticks at any moment: a lease lasts L ticks
 *     (ACK_TIMEOUT), computed when the row is locked (clock_timestamp), so a claim or renewal
 *     always starts a lease of L ticks from the moment it took the row;
 *   - a transactional batch does not lock its rows while its handlers run: its outcomes are
 *     recorded at the end with the normal fenced statements (token, processing, unexpired),
 *     which lock the rows, then it commits; the server ends the transaction no later than the
 *     batch's lease deadline (`deadline()`), rolling back its effects and outcomes;
 *   - the sweep (expired processing rows, skipping locked rows, to pending or dead), an
 *     operator's force requeue (processing -> pending, waits for row locks) and redrive
 *     (dead -> pending);
 *   - faults: a worker stalls for any number of ticks (it is simply not scheduled; its keeper
 *     may stall with it or not), crashes (loses every local state; its open transaction stays
 *     on the server until its deadline), and is cut off (its statements are lost or wait for
 *     the heal; a claim can commit with its answer lost; a transaction it gives up on stays
 *     open on the server until its deadline).
 *
 * Time is relative: each lease and each worker's own estimate of its lease count the ticks
 * left, so the state space is finite without bounding how long anything runs.
 *
 * Properties (assertions, checked after every step by `settle()`, and one LTL formula):
 *   P1 no accepted message lost: every message is always in one of the four states, moves
 *      only along an edge of zeroloss.states.TRANSITIONS from the state it is in (`MOVE`),
 *      and is completed only after its handler ran (plain) or with its effect (transactional);
 *   P2 never two live leases: at most one worker believes it holds a live lease on a message
 *      (claimed or renewed, not refused since, its own estimate not run out), except one an
 *      operator revoked with a force requeue; and such a belief is always backed by the
 *      ledger: that worker's token, processing, the ledger's expiry no earlier than its own;
 *   P3 fencing: no outcome (acknowledge, fail, release) is written or committed under a stale
 *      lease (another token issued since, or the lease expired, by the database clock, and was
 *      not revived since);
 *   P4 a transactional effect is committed at most once per message, and only together with
 *      its acknowledgement (completed <=> its effect committed);
 *   P5 (ltl `terminal`) under weak fairness every message ends completed or dead for good.
 *
 * Bounds: N = 2 messages, MAXATT = 2 attempts, L = 2 ticks; W (compile time: spin -DW=3).
 * Chosen when the verifier starts (environment), so one compiled verifier runs them all:
 *   ZL_KINDS     0 both messages plain, 1 both transactional (default), 2 message 0 plain and
 *                message 1 transactional (batches of one);
 *   ZL_CRASHES   crashes, all workers together, at most one each (default 1);
 *   ZL_CUTS      cuts, all workers together (default 1);
 *   ZL_REQUEUES  operator force requeues, ZL_REDRIVES operator redrives (default 1 each);
 *   ZL_MUTANT    a broken variant of the protocol, which must fail a property:
 *     ack_no_expiry       outcomes not fenced by the lease's expiry (P3);
 *     renew_no_token      a renewal not fenced by the token (P2, with a force requeue);
 *     no_deadline         the server never ends a batch's transaction (P3; P5 with a crash);
 *     handler_commits     a transactional handler COMMITs the batch's transaction (P4);
 *     handler_rolls_back  a transactional handler ROLLBACKs it, unnoticed (P1);
 *     keeper_forgets      the keeper takes an unstarted message out of its batch before its
 *                         release statement, which fails, and renews it for ever (P5);
 *     revive_no_token     a revival not fenced by the token (P2: it revives a lease the sweep
 *                         ended and another worker holds since).
 *
 * Run (tests/process/test_lease_model.py runs each configuration and each mutant):
 *   spin -DW=2 -a lease.pml && gcc -O2 -DNFAIR=3 -o pan pan.c
 *   ZL_KINDS=0 ZL_CUTS=0 ./pan -N safety               safety (assertions P1-P4)
 *   ZL_KINDS=2 ZL_CUTS=0 ./pan -a -f -N terminal       liveness under weak fairness (P5)
 * A replay of a trail runs no C code: give the run's settings to spin as macros, e.g.
 *   spin -DW=2 -DZL_KINDS=2 -DZL_CUTS=0 -t -p lease.pml
 */

#ifndef W
#define W 2
#endif
#if W < 2 || W > 3
#error "W is 2 or 3 (TICKING below lists the estimates of three workers at most)"
#endif
#define N 2    /* not a parameter: claims, renewals and EXPIRED spell out both messages */
#ifndef L
#define L 2
#endif
#ifndef MAXATT
#define MAXATT 2
#endif

/* Chosen when the verifier starts (environment variables read by `init`), so that one
 * compiled verifier checks every configuration and every mutant; constant during a run. */
c_code {
/* pan.c includes stdlib.h and string.h (an #include here would be expanded by spin's cpp) */
static int zl_env(const char *name, int otherwise) {   /* the variable's value, if set */
    const char *v = getenv(name);
    return v && *v ? atoi(v) : otherwise;
}
static int zl_mutant(int otherwise) {
    static const char *names[] = {"", "ack_no_expiry", "renew_no_token", "no_deadline",
        "handler_commits", "handler_rolls_back", "keeper_forgets", "revive_no_token", 0};
    const char *v = getenv("ZL_MUTANT");
    int k;
    if (!v || !*v) return otherwise;
    for (k = 1; names[k]; k++) if (strcmp(v, names[k]) == 0) return k;
    fputs("unknown ZL_MUTANT (see lease.pml)", stderr);
    exit(2);
}
}
/* Defaults for a replay (spin -t runs no C code: pass the run's values as -DZL_KINDS=... ). */
#ifndef ZL_KINDS
#define ZL_KINDS 1
#endif
#ifndef ZL_CRASHES
#define ZL_CRASHES 1
#endif
#ifndef ZL_CUTS
#define ZL_CUTS 1
#endif
#ifndef ZL_REQUEUES
#define ZL_REQUEUES 1
#endif
#ifndef ZL_REDRIVES
#define ZL_REDRIVES 1
#endif
#ifndef ZL_MUTANT
#define ZL_MUTANT 0
#endif
byte kinds = ZL_KINDS;                /* 0 both messages plain, 1 both transactional, 2 one of each */
byte crash_budget = ZL_CRASHES;       /* crashes, all workers together (at most one each) */
byte cut_budget = ZL_CUTS;            /* cuts, all workers together */
byte requeue_budget = ZL_REQUEUES;    /* operator force requeues */
byte redrive_budget = ZL_REDRIVES;    /* operator redrives */
byte mutant = ZL_MUTANT;              /* 0, the protocol; else one broken variant (below) */
#define M_ACK_NO_EXPIRY 1
#define M_RENEW_NO_TOKEN 2
#define M_NO_DEADLINE 3
#define M_HANDLER_COMMITS 4
#define M_HANDLER_ROLLS_BACK 5
#define M_KEEPER_FORGETS 6
#define M_REVIVE_NO_TOKEN 7

/* Is message m on a transactional queue? */
#define TXK(m) (kinds == 1 || (kinds == 2 && (m) == 1))

/* statuses (zeroloss.states.Status) */
#define PEND 0
#define PROC 1
#define COMP 2
#define DEAD 3

/* worker phases */
#define IDLE 0
#define RUN 1
#define FLUSH 2
#define TXEND 3
#define TXCOMMIT 4
#define TXWAIT 5

/* outcomes */
#define ACK 1
#define FAIL 2

#define IX(w, m) ((w) * N + (m))
#define BIT(m) (1 << (m))
#define HAS(mask, m) ((((mask) >> (m)) & 1) == 1)
/* The transaction slot of worker w: a crashed worker's transaction stays open in its slot. */
#define SLOTS (W * 2)
#define SLOT(w) ((w) * 2 + crashes[w])
/* Faults left to inject. */
#define CRASH_LEFT(w) (crashed < crash_budget && crashes[w] == 0)
#define CUT_LEFT (cutoffs < cut_budget)

/* A move of the ledger: from the status it is in, along an edge of zeroloss.states.TRANSITIONS
 * (the reason names the edge; the test checks each against the Python table). */
#define MOVE(m, from, to, reason) assert(st[m] == from); st[m] = to

/* -- the ledger (database state) ---------------------------------------------------------- */
byte st[N];            /* status; 0 = pending: both messages accepted before the run starts */
byte att[N];           /* attempts */
byte lease[N];         /* ticks until the lease expires; 0: expired, or no lease */
byte lk[N];            /* 0, or 1 + the slot of the transaction that holds the row's lock */
bit tok[W * N];        /* worker w's copy of m's lease token is the row's current token */
bool txopen[SLOTS];    /* a batch's transaction is open on the server */
byte txb[SLOTS];       /* the messages whose leases bound that transaction (its deadline) */
bool txeff[SLOTS * N]; /* an uncommitted effect of the handler of m */
byte txout[SLOTS * N]; /* an uncommitted, row-locking outcome of m */

/* -- the workers' local state (lost in a crash) -------------------------------------------- */
byte ph[W];            /* phase */
byte unst[W];          /* claimed messages not started yet */
byte cur[W];           /* 0, or 1 + the message whose handler is running */
byte outb[W * N];      /* an outcome decided, not yet recorded */
byte kset[W];          /* the keeper's set: messages of the batch in hand */
byte zombie[W];        /* keeper_forgets only: renewed, no longer in the batch */
byte wl[W * N];        /* the worker's own estimate: ticks until its lease has surely expired */
byte rv[W];            /* the messages revived since the batch's claim (each at most once: the
                          code revives for at most REVIVE_WITHIN seconds; a model has none) */

/* -- faults and the operator's budget ------------------------------------------------------ */
bool cut[W];
byte crashes[W];       /* crashes of worker w (its transaction slot) */
byte crashed;          /* crashes of all workers */
byte cutoffs;          /* cuts of all workers */
byte requeues;
byte redrives;

/* -- ghosts: what the properties are stated in --------------------------------------------- */
bool ran[N];           /* a plain handler of m returned (its outside effect happened) */
byte effc[N];          /* transactional effects of m committed */
bool stale[W * N];     /* w's lease on m was superseded or expired since w claimed it */
bool revoked[W * N];   /* an operator force-requeued m under w's lease */

hidden byte i, j, n, s;

/* A believed-live lease (P2). */
#define LIVE(w, m) ((HAS(kset[w], m) || HAS(zombie[w], m)) && wl[IX(w, m)] > 0)

/* The fences of the lease holder's statements (statements.py: _FENCE + _UNEXPIRED). */
#define FENCE_OUTCOME(w, m) (tok[IX(w, m)] && st[m] == PROC && (lease[m] > 0 || mutant == M_ACK_NO_EXPIRY))
#define FENCE_RENEW(w, m) ((tok[IX(w, m)] || mutant == M_RENEW_NO_TOKEN) && st[m] == PROC && lease[m] > 0)
/* A revival (REVIVE): the token and the status, not the expiry. */
#define FENCE_REVIVE(w, m) ((tok[IX(w, m)] || mutant == M_REVIVE_NO_TOKEN) && st[m] == PROC)
/* The sweep's rows: expired, processing, not locked (SKIP LOCKED). */
#define SWEEPABLE(m) (st[m] == PROC && lease[m] == 0 && lk[m] == 0)

/* N = 2: the messages whose leases have run out, as a mask. */
#define EXPIRED ((lease[0] == 0 -> 1 : 0) + (lease[1] == 0 -> 2 : 0))

/* The row of m gets a new lease token (w's), or none (w == W): every other copy is stale. */
inline retoken(m, w) {
    for (j : 0 .. W - 1) {
        if
        :: j == w -> tok[IX(j, m)] = 1; stale[IX(j, m)] = 0; revoked[IX(j, m)] = 0
        :: else -> tok[IX(j, m)] = 0; stale[IX(j, m)] = 1
        fi
    }
}

/* The server ends every transaction past its batch's lease deadline: one of the leases it
 * holds has run out, or none is left. Its effects and outcomes roll back, its locks go. */
inline deadline() {
    for (s : 0 .. SLOTS - 1) {
        if
        :: txopen[s] && (txb[s] == 0 || (txb[s] & EXPIRED) != 0) && mutant != M_NO_DEADLINE ->
            txopen[s] = false;
            txb[s] = 0;
            for (i : 0 .. N - 1) {
                txeff[s * N + i] = false;
                txout[s * N + i] = 0;
                if
                :: lk[i] == s + 1 -> lk[i] = 0
                :: else
                fi
            }
        :: else
        fi
    }
}

/* After every step: the server's deadlines, then the invariants P1, P2, P4. */
inline settle() {
    deadline();
    for (i : 0 .. N - 1) {
        if
        :: st[i] >= COMP -> att[i] = 0    /* not read again (a redrive resets it): one state */
        :: else
        fi;
        assert(st[i] <= DEAD);                                           /* P1 */
        assert(st[i] != COMP || (TXK(i) -> effc[i] == 1 : ran[i]));      /* P1 */
        assert(effc[i] <= 1);                                            /* P4 */
        assert(!TXK(i) || ((st[i] == COMP) == (effc[i] == 1)));          /* P4 */
        n = 0;
        for (j : 0 .. W - 1) {
            if
            :: LIVE(j, i) && !revoked[IX(j, i)] ->
                n++;
                assert(tok[IX(j, i)] && st[i] == PROC && lease[i] >= wl[IX(j, i)]);  /* P2 */
            :: else
            fi
        }
        assert(n <= 1);                                                  /* P2 */
    }
    skip    /* a loop may not end a d_step */
}

/* A worker forgets a message of its batch (recorded, refused, released or given up). */
inline forget(w, m) {
    kset[w] = kset[w] & ~BIT(m);
    outb[IX(w, m)] = 0;
    wl[IX(w, m)] = 0;
}

/* A worker gives up its whole batch (its transaction was ended, or it gave up on it). */
inline give_up(w) {
    for (i : 0 .. N - 1) {
        if
        :: HAS(kset[w], i) -> forget(w, i)
        :: else
        fi
    }
    unst[w] = 0;
    cur[w] = 0;
}

/* Claim the messages of mask n (pending): attempts + 1, a new token, a lease of L ticks from
 * the row's lock. known: the answer reached the worker (else it committed unseen). */
inline claim(w, known) {
    for (i : 0 .. N - 1) {
        if
        :: HAS(n, i) ->
            retoken(i, w);
            ran[i] = false;
            MOVE(i, PEND, PROC, claimed);
            att[i]++;
            lease[i] = L;
            if
            :: known -> wl[IX(w, i)] = L
            :: else
            fi
        :: else
        fi
    }
    if
    :: known ->
        unst[w] = n;
        kset[w] = n;
        rv[w] = 0;
        ph[w] = RUN;
        if
        :: (HAS(n, 0) && TXK(0)) || (HAS(n, 1) && TXK(1)) ->
            s = SLOT(w);
            assert(!txopen[s]);
            txopen[s] = true;    /* BEGIN: the batch's transaction, bounded by these leases */
            txb[s] = n
        :: else
        fi
    :: else
    fi
}

/* A fenced outcome of worker w for m, written now (plain: autocommitted with the batch). */
inline record(w, m, outcome) {
    assert(!stale[IX(w, m)]);                                            /* P3 */
    retoken(m, W);
    lease[m] = 0;
    if
    :: outcome == ACK -> MOVE(m, PROC, COMP, acknowledged)
    :: outcome == FAIL && att[m] >= MAXATT -> MOVE(m, PROC, DEAD, dead_lettered)
    :: outcome == FAIL && att[m] < MAXATT -> MOVE(m, PROC, PEND, failed)
    fi
}

/* In a phase of a transactional batch where the worker's next step is a statement of it. */
#define IN_BATCH_TX(w) (ph[w] == TXEND || ph[w] == TXCOMMIT || (ph[w] == RUN && TXK(NEXT(w))))

/* Each step below is one d_step: what one statement (or one local action) does, atomically.
 * A choice (which messages, which outcome) is a separate branch, since a d_step is
 * deterministic. */

/* Claim the messages of mask `mask` (and BEGIN a transactional batch's transaction). */
#define CLAIM_IF(mask) ((mask) == 3 -> (st[0] == PEND && st[1] == PEND && TXK(0) == TXK(1)) : st[(mask) - 1] == PEND)

/* Start message m of the batch. */
inline start(w, m) {
    unst[w] = unst[w] & ~BIT(m);
    cur[w] = m + 1
}

/* Revive m, claimed and not started, whose lease the worker believes run out (it waited for
 * the row's lock). Refused: the estimate stays run out. known: the answer reached the worker
 * (else the revival committed unseen: the ledger's lease is live again, the estimate is not). */
inline revive(w, m, known) {
    rv[w] = rv[w] | BIT(m);
    if
    :: FENCE_REVIVE(w, m) ->
        lease[m] = L;
        stale[IX(w, m)] = false;    /* no other token since its claim: a lease of its own again */
        if
        :: known -> wl[IX(w, m)] = L
        :: else
        fi
    :: else
    fi
}

/* The running handler returns with `outcome`: a plain one's effect has happened (outside the
 * database); a transactional one's is written in the batch's transaction (or, if it failed,
 * rolled back to its savepoint). The outcome waits for the batch's end. */
inline handler_returns(w, outcome) {
    if
    :: cur[w] == 0 -> n = (unst[w] == 1 -> 0 : 1); unst[w] = 0    /* the last one, started */
    :: else -> n = cur[w] - 1
    fi;
    outb[IX(w, n)] = outcome;
    if
    :: outcome == ACK && TXK(n) && mutant == M_HANDLER_COMMITS ->
        /* the handler COMMITs the batch's transaction itself: effects durable without acks */
        for (i : 0 .. N - 1) {
            if
            :: txeff[SLOT(w) * N + i] -> effc[i]++; txeff[SLOT(w) * N + i] = false
            :: else
            fi
        }
        effc[n]++
    :: outcome == ACK && TXK(n) && mutant == M_HANDLER_ROLLS_BACK ->
        /* the handler ROLLBACKs it: the batch's effects so far (its own too) are gone */
        for (i : 0 .. N - 1) { txeff[SLOT(w) * N + i] = false }
    :: outcome == ACK && TXK(n) && mutant != M_HANDLER_COMMITS && mutant != M_HANDLER_ROLLS_BACK ->
        txeff[SLOT(w) * N + n] = true
    :: outcome == ACK && !TXK(n) -> ran[n] = true
    :: else
    fi;
    cur[w] = 0;
    if
    :: unst[w] == 0 && TXK(n) -> ph[w] = TXEND
    :: unst[w] == 0 && !TXK(n) -> ph[w] = FLUSH
    :: else
    fi
}

/* Plain: the batched outcomes, one fenced statement per kind, each row fenced. */
inline flush(w) {
    for (m : 0 .. N - 1) {
        if
        :: outb[IX(w, m)] != 0 ->
            if
            :: FENCE_OUTCOME(w, m) -> record(w, m, outb[IX(w, m)])
            :: else    /* refused: the lease was lost */
            fi;
            forget(w, m)
        :: else
        fi
    }
    m = 0;
    ph[w] = IDLE
}

/* Transactional: the outcomes, fenced, inside the batch's transaction (they lock the rows);
 * a refused acknowledgement rolls its handler's effect back to its savepoint. */
inline tx_outcomes(w) {
    s = SLOT(w);
    for (m : 0 .. N - 1) {
        if
        :: outb[IX(w, m)] != 0 ->
            if
            :: FENCE_OUTCOME(w, m) ->
                assert(!stale[IX(w, m)]);                                    /* P3 */
                lk[m] = s + 1;
                txout[s * N + m] = outb[IX(w, m)]
            :: else ->
                txeff[s * N + m] = false;
                txb[s] = txb[s] & ~BIT(m)
            fi
        :: else
        fi
    }
    m = 0;
    ph[w] = TXCOMMIT
}

/* COMMIT: the batch's effects and outcomes become durable together. */
inline tx_commit(w) {
    s = SLOT(w);
    for (m : 0 .. N - 1) {
        if
        :: txout[s * N + m] != 0 ->
            lk[m] = 0;
            record(w, m, txout[s * N + m]);
            txout[s * N + m] = 0
        :: else
        fi;
        if
        :: txeff[s * N + m] -> effc[m]++; txeff[s * N + m] = false
        :: else
        fi;
        if
        :: HAS(kset[w], m) -> forget(w, m)
        :: else
        fi
    }
    m = 0;
    s = SLOT(w);
    txopen[s] = false;
    txb[s] = 0;
    ph[w] = IDLE
}

/* The message whose handler returns next, and whether it can. */
#define NEXT(w) (cur[w] != 0 -> cur[w] - 1 : (unst[w] == 1 -> 0 : 1))
#define RETURNS(w) (ph[w] == RUN && (cur[w] != 0 || unst[w] == 1 || unst[w] == 2) && (!TXK(NEXT(w)) || (txopen[SLOT(w)] && !cut[w])))

proctype worker(byte w) {
    byte m;
end:
    do
    /* Claim one or both pending messages of one queue. */
    :: d_step { ph[w] == IDLE && !cut[w] && CLAIM_IF(1) -> n = 1; claim(w, true); settle() }
    :: d_step { ph[w] == IDLE && !cut[w] && CLAIM_IF(2) -> n = 2; claim(w, true); settle() }
    :: d_step { ph[w] == IDLE && !cut[w] && CLAIM_IF(3) -> n = 3; claim(w, true); settle() }
    /* Cut off: the claim commits, its answer is lost (the leases run out unused). */
    :: d_step { ph[w] == IDLE && cut[w] && CLAIM_IF(1) -> n = 1; claim(w, false); settle() }
    :: d_step { ph[w] == IDLE && cut[w] && CLAIM_IF(2) -> n = 2; claim(w, false); settle() }
    :: d_step { ph[w] == IDLE && cut[w] && CLAIM_IF(3) -> n = 3; claim(w, false); settle() }
    /* Start the first message of a batch of two (in either order): while it runs, the other
     * may be released. */
    :: d_step { ph[w] == RUN && cur[w] == 0 && unst[w] == 3 -> start(w, 0) }
    :: d_step { ph[w] == RUN && cur[w] == 0 && unst[w] == 3 -> start(w, 1) }
    /* Revive a message not started whose lease ran out here (the claim's commit was slow). */
    :: d_step { ph[w] == RUN && HAS(unst[w], 0) && wl[IX(w, 0)] == 0 && lk[0] == 0 && !HAS(rv[w], 0) && !cut[w] -> revive(w, 0, true); settle() }
    :: d_step { ph[w] == RUN && HAS(unst[w], 1) && wl[IX(w, 1)] == 0 && lk[1] == 0 && !HAS(rv[w], 1) && !cut[w] -> revive(w, 1, true); settle() }
    /* Cut off: the revival commits, its answer is lost (the estimate stays run out). */
    :: d_step { ph[w] == RUN && HAS(unst[w], 0) && wl[IX(w, 0)] == 0 && lk[0] == 0 && !HAS(rv[w], 0) && cut[w] -> revive(w, 0, false); settle() }
    :: d_step { ph[w] == RUN && HAS(unst[w], 1) && wl[IX(w, 1)] == 0 && lk[1] == 0 && !HAS(rv[w], 1) && cut[w] -> revive(w, 1, false); settle() }
    /* The running handler returns, or the last one runs and returns (one step: nothing can
     * tell its start apart from the step before). A transactional one writes in the batch's
     * open transaction. */
    :: d_step { RETURNS(w) -> handler_returns(w, ACK); settle() }
    :: d_step { RETURNS(w) -> handler_returns(w, FAIL); settle() }
    :: d_step { ph[w] == FLUSH && !cut[w] -> flush(w); settle() }
    :: d_step { ph[w] == TXEND && !cut[w] && txopen[SLOT(w)] -> tx_outcomes(w); settle() }
    :: d_step { ph[w] == TXCOMMIT && !cut[w] && txopen[SLOT(w)] -> tx_commit(w); settle() }
    /* The server ended the batch's transaction (its deadline): the next statement fails. */
    :: d_step { IN_BATCH_TX(w) && !txopen[SLOT(w)] -> give_up(w); ph[w] = IDLE; settle() }
    /* Cut off in a batch: the worker gives its connection up; the transaction stays open on
     * the server until its deadline (the keeper no longer renews its leases). */
    :: d_step { IN_BATCH_TX(w) && cut[w] && txopen[SLOT(w)] -> give_up(w); ph[w] = TXWAIT; settle() }
    :: d_step { ph[w] == TXWAIT && !txopen[SLOT(w)] -> ph[w] = IDLE }
    /* A crash: every local state is gone (the keeper's too); a transaction stays open on the
     * server, in its slot, until its deadline. The worker starts again at once. */
    :: d_step { CRASH_LEFT(w) -> give_up(w); crashed++; crashes[w]++; ph[w] = IDLE; zombie[w] = 0; settle() }
    /* Cut off, and healed. */
    :: d_step { !cut[w] && CUT_LEFT -> cut[w] = true; cutoffs++ }
    :: d_step { cut[w] -> cut[w] = false }
    od
}

/* In the keeper's set, believed live (a lease whose estimate ran out, or whose renewal was
 * refused, is lost: never renewed again), its row not locked (renewals SKIP LOCKED rows). */
#define RENEWABLE(w, m) (LIVE(w, m) && lk[m] == 0)

/* Renew one row, fenced; a refusal marks the lease lost (the estimate drops to nothing). Due
 * once the worker's own estimate has dropped below a full lease. */
inline renew(w, m) {
    if
    :: FENCE_RENEW(w, m) ->
        lease[m] = L;
        wl[IX(w, m)] = L;
        revoked[IX(w, m)] = false    /* told its lease is still live */
    :: else -> wl[IX(w, m)] = 0
    fi
}

/* A handler runs long: give back a claimed message not started (fenced, attempt not counted).
 * If the statement fails (cut off) nothing changes: the message stays in hand, to run or to be
 * released. */
inline release(w, m) {
    if
    :: FENCE_OUTCOME(w, m) ->
        assert(!stale[IX(w, m)]);                                            /* P3 */
        retoken(m, W);
        MOVE(m, PROC, PEND, released);
        att[m]--;
        lease[m] = 0
    :: else
    fi;
    unst[w] = unst[w] & ~BIT(m);
    txb[SLOT(w)] = txb[SLOT(w)] & ~BIT(m);
    forget(w, m)
}

/* keeper_forgets: the message leaves the batch before the release statement runs; the
 * statement fails; the keeper goes on renewing it for ever. */
inline forget_unreleased(w, m) {
    unst[w] = unst[w] & ~BIT(m);
    kset[w] = kset[w] & ~BIT(m);
    zombie[w] = zombie[w] | BIT(m)
}

proctype keeper(byte w) {
end:
    do
    :: d_step { RENEWABLE(w, 0) && wl[IX(w, 0)] < L && !cut[w] -> renew(w, 0); settle() }
    :: d_step { RENEWABLE(w, 1) && wl[IX(w, 1)] < L && !cut[w] -> renew(w, 1); settle() }
    /* Cut off: the renewal commits, its answer is lost (the estimate is not extended). */
    :: d_step { RENEWABLE(w, 0) && lease[0] < L && cut[w] && FENCE_RENEW(w, 0) -> lease[0] = L; settle() }
    :: d_step { RENEWABLE(w, 1) && lease[1] < L && cut[w] && FENCE_RENEW(w, 1) -> lease[1] = L; settle() }
    :: d_step { HAS(unst[w], 0) && cur[w] != 0 && !cut[w] -> release(w, 0); settle() }
    :: d_step { HAS(unst[w], 1) && cur[w] != 0 && !cut[w] -> release(w, 1); settle() }
    :: d_step { mutant == M_KEEPER_FORGETS && HAS(unst[w], 0) && cur[w] != 0 -> forget_unreleased(w, 0); settle() }
    :: d_step { mutant == M_KEEPER_FORGETS && HAS(unst[w], 1) && cur[w] != 0 -> forget_unreleased(w, 1); settle() }
    od
}

/* Everything but the workers, in one process (fewer processes for the fairness check; the
 * choice among them is free, and none can go on for ever while another waits: the clock
 * stops once no lease runs, the operator's budget runs out). */

#if W == 2
#define TICKING (lease[0] + lease[1] + wl[0] + wl[1] + wl[2] + wl[3] > 0)
#else
#define TICKING (lease[0] + lease[1] + wl[0] + wl[1] + wl[2] + wl[3] + wl[4] + wl[5] > 0)
#endif

/* A force requeue: processing, whatever its lease (it waits for the row's lock); the attempts
 * are reset. The holder's lease is revoked: it learns so at its next renewal. */
inline requeue(m) {
    requeues++;
    for (j : 0 .. W - 1) {
        if
        :: tok[IX(j, m)] -> revoked[IX(j, m)] = true
        :: else
        fi
    }
    retoken(m, W);
    MOVE(m, PROC, PEND, requeued_by_operator);
    att[m] = 0;
    lease[m] = 0
}

inline redrive(m) {
    redrives++;
    MOVE(m, DEAD, PEND, redriven_by_operator);
    att[m] = 0
}

active proctype environment() {
end:
    do
    /* The database clock: one tick. Leases and the workers' estimates run down together. */
    :: d_step {
        TICKING ->
        for (i : 0 .. N - 1) {
            if
            :: lease[i] > 0 ->
                lease[i]--;
                if
                :: lease[i] == 0 -> for (j : 0 .. W - 1) { stale[IX(j, i)] = true }
                :: else
                fi
            :: else
            fi
        }
        for (i : 0 .. W * N - 1) {
            if
            :: wl[i] > 0 -> wl[i]--
            :: else
            fi
        }
        settle()
    }
    /* Time passes with no lease running (so that a run where nothing can happen any more is
     * an infinite run, and the liveness check sees it). */
    :: d_step { !TICKING && !SWEEPABLE(0) && !SWEEPABLE(1) -> skip }
    /* The recovery sweep: every expired processing row not locked, in one statement. */
    :: d_step {
        SWEEPABLE(0) || SWEEPABLE(1) ->
        for (i : 0 .. N - 1) {
            if
            :: SWEEPABLE(i) ->
                retoken(i, W);
                lease[i] = 0;
                if
                :: att[i] >= MAXATT -> MOVE(i, PROC, DEAD, dead_lettered)
                :: else -> MOVE(i, PROC, PEND, lease_expired)
                fi
            :: else
            fi
        }
        settle()
    }
    /* The operator: a force requeue (processing, whatever its lease; it waits for the row's
     * lock) and a redrive (dead), each resetting the attempts. */
    :: d_step { requeues < requeue_budget && st[0] == PROC && lk[0] == 0 -> requeue(0); settle() }
    :: d_step { requeues < requeue_budget && st[1] == PROC && lk[1] == 0 -> requeue(1); settle() }
    :: d_step { redrives < redrive_budget && st[0] == DEAD -> redrive(0); settle() }
    :: d_step { redrives < redrive_budget && st[1] == DEAD -> redrive(1); settle() }
    od
}

init {
    atomic {
        c_code {
            now.kinds = zl_env("ZL_KINDS", now.kinds);
            now.crash_budget = zl_env("ZL_CRASHES", now.crash_budget);
            now.cut_budget = zl_env("ZL_CUTS", now.cut_budget);
            now.requeue_budget = zl_env("ZL_REQUEUES", now.requeue_budget);
            now.redrive_budget = zl_env("ZL_REDRIVES", now.redrive_budget);
            now.mutant = zl_mutant(now.mutant);
        };
        for (i : 0 .. W - 1) {
            run worker(i);
            run keeper(i)
        }
        i = 0
    }
}

/* P5. (Run with -a -f.) */
ltl terminal { <> [] (st[0] >= COMP && st[1] >= COMP) }
/* A claim for the safety run (assertions only; the verifier has claims compiled in). */
ltl safety { [] (st[0] <= DEAD && st[1] <= DEAD) }
