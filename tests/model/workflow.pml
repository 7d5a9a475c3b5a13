/*
 * The release of a workflow's steps (issue 47), as a Promela model for spin: a step that waits
 * for its dependencies is released by the fenced outcome of its last one, in that outcome's
 * transaction. The lease protocol itself (renewals, transactional batches, P1-P5) is
 * lease.pml's; this model keeps of it what the release leans on: claims, leases that run out by
 * the database clock, the fenced outcome statement, the sweep, an operator's force requeue and
 * redrive, and workers that stall, crash and get cut off.
 *
 * What is modelled (docs/workflows.md; zeroloss/ledger/sql/workflows.sql):
 *   - a diamond of four steps: A (pending) -> B, C (waiting) -> D (waiting); each edge is a
 *     dependency row, settled once ("" until the upstream's outcome settles it: completed, dead
 *     or cancelled); each step's dependencies are counted in fan-in groups (`left`: the
 *     group's unsettled dependencies) and the step counts its groups not yet empty
 *     (`waiting_on`). D's two dependencies are one group of two (ZL_FANIN=2) or two groups of
 *     one (ZL_FANIN=1); B's and C's one dependency each is a group of one;
 *   - the release, in the transaction of the outcome, after its fenced statement (token,
 *     processing, unexpired), of only the row that statement moved: SETTLE (the upstream's
 *     edges not settled yet: once each), FANIN_DECREMENT (groups locked, left - n), STEP_DECREMENT
 *     (steps whose group emptied locked, waiting_on - k), STEP_RELEASE (waiting with nothing
 *     left -> pending) and STEP_CANCEL (waiting -> cancelled); the edges of the steps it
 *     cancelled are settled in a next round (zeroloss.ledger.workflows.settle's loop), then
 *     COMMIT. Each is a step of its own (other transactions run in between); a row another
 *     transaction locked is waited for; what a transaction wrote is seen by others only when
 *     it commits;
 *   - the failure policies (ZL_POLICY: B's and C's; ZL_POLICY_D: D's): wait (a dead
 *     dependency settles nothing: the step waits for a redrive; a cancelled one cancels it),
 *     run (an ended dependency settles and counts) or cancel (an ended dependency cancels the
 *     step, whose own edges then settle as cancelled, for its dependents' policies);
 *   - the sweep (an expired processing row -> pending, or dead once its attempts are spent, in
 *     a transaction that releases or cancels like an outcome's), an operator's force requeue
 *     (processing -> pending, whatever the lease), redrive (dead -> pending, attempts reset;
 *     its settled edges stay settled), cancel (a pending step, or a waiting one as
 *     cancel_workflow does) and dead-lettering (a pending or running step), the last two
 *     settling the step's dependents in their transaction; the sweep's and the operator's
 *     transactions take turns (one slot);
 *   - W = 2 workers, each claiming one pending step at a time, or B and C in one batch
 *     (ZL_BATCH=1: their outcomes then recorded together, each row fenced, released in one
 *     transaction: a group counts down by two, a step by two groups); a handler returns after
 *     any number of ticks, succeeding or failing; a worker stalls (is not scheduled), crashes
 *     (loses its state; its open transaction stays on the server, its locks held, until the
 *     server ends it) or is cut off (a claim commits with its answer lost; a statement is
 *     lost; a COMMIT lands or not, its answer lost; a transaction it gives up on stays open
 *     until the server ends it);
 *   - the server ends a transaction whose worker is gone (crashed, or gave it up) at any later
 *     moment (the session keepalives of DEAD_PEER_TIMEOUT), rolling back its outcome and
 *     release; a live worker's transaction is not bounded by its lease: it may commit after
 *     the lease ran out (the outcome's statement was fenced, and its row lock kept the sweep,
 *     a requeue and every claim off the row since).
 *
 * A row that leaves processing keeps its lease token and expiry here (the code clears both;
 * the model drops them only at a finished status, where the status fence refuses anyway): the
 * model leans on the outcome's three fences, so each is shown to be needed.
 *
 * Properties:
 *   W1 never early (assertion, every state): a step that left waiting other than cancelled has
 *      every dependency settled and counted (completed; or, under "run", dead or cancelled);
 *   W2 released once (assertion): a step is released only from waiting, and only once;
 *   W3 counted right (assertions, every state): a waiting step's groups each count exactly its
 *      unsettled dependencies, the step counts exactly its non-empty groups, and a waiting step
 *      always waits for something (the sweep's safety net, STEP_RELEASE_STRANDED, is not
 *      modelled: the protocol never needs it);
 *   W4 a stale outcome releases nothing (assertions): an outcome statement moves its row only
 *      under the current lease (no other claim since, the row processing since, the lease not
 *      expired), and only a row it moved (or a step its release cancelled) has its edges
 *      settled;
 *   W5 none waits for ever (ltl `done`, -a -f): under weak fairness every step ends completed,
 *      dead or cancelled, except a waiting one behind a dead dependency under "wait", or behind
 *      a step that waits so (a redrive that completes releases it: redrives are in the runs).
 * Every move goes along an edge of zeroloss.core.states.TRANSITIONS (`MOVE`, checked by
 * tests/process/test_workflow_model.py against the table).
 *
 * Bounds: 4 steps, W = 2 workers, a lease of L = 1 tick, ZL_MAXATT attempts (1 or 2).
 * Chosen when the verifier starts (environment):
 *   ZL_POLICY    B's and C's failure policy: 0 wait (default), 1 run, 2 cancel;
 *   ZL_POLICY_D  D's (default: ZL_POLICY's);
 *   ZL_FANIN     2: D's dependencies one group of two (default); 1: two groups of one;
 *   ZL_BATCH     1: a worker may claim B and C in one batch (default 0);
 *   ZL_MAXATT    attempts per step (default 2);
 *   ZL_CRASHES, ZL_CUTS, ZL_REQUEUES, ZL_REDRIVES, ZL_CANCELS, ZL_DEADLETTERS  faults and
 *                operator actions (default 1, 0, 0, 1, 0, 0);
 *   ZL_MUTANT    a broken variant of the protocol, which must fail a property:
 *     release_no_token    the outcome (so its release) not fenced by the lease token (W4);
 *     release_no_status   not fenced by the status, processing (W4, with a force requeue);
 *     release_no_expiry   not fenced by the lease's expiry (W4);
 *     decrement_unlocked  counters read, then written (no row lock): a lost decrement (W3;
 *                         W5, D waits for ever);
 *     settle_twice        SETTLE without its "not settled yet": a redriven step counts again (W1);
 *     cancel_unsettled    the edges of a step the release cancels are not settled: its
 *                         dependents wait for ever (W5);
 *     count_once          each counter decremented by one, whatever the batch settled in it
 *                         (W3, with batches);
 *     release_not_waiting STEP_RELEASE without status = 'waiting': a step the operator
 *                         cancelled is released when its count reaches zero (W2);
 *     release_refused     the release run for an acknowledged row whose outcome statement
 *                         was refused (stale), not only for the rows it moved (W4).
 *
 * Run (tests/process/test_workflow_model.py runs each configuration and each mutant):
 *   spin -a workflow.pml && gcc -O2 -DNFAIR=3 -o pan pan.c
 *   ZL_POLICY=1 ./pan -N safety                 safety (W1-W4)
 *   ZL_POLICY=0 ./pan -a -f -N done             liveness under weak fairness (W5)
 */

#ifndef W
#define W 2
#endif
#if W != 2
#error "W is 2 (the slots of ABANDONED below are two workers')"
#endif
#define NM 4   /* steps: A B C D */
#define NE 4   /* edges: A->B, A->C, B->D, C->D */
#define NB 4   /* fan-in groups: B's, C's, D's first, D's second (ZL_FANIN=1 only) */
#ifndef L
#define L 1
#endif

c_code {
static int zl_env(const char *name, int otherwise) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : otherwise;
}
static int zl_mutant(int otherwise) {
    static const char *names[] = {"", "release_no_token", "release_no_status", "release_no_expiry",
        "decrement_unlocked", "settle_twice", "cancel_unsettled", "count_once", "release_not_waiting", "release_refused", 0};
    const char *v = getenv("ZL_MUTANT");
    int k;
    if (!v || !*v) return otherwise;
    for (k = 1; names[k]; k++) if (strcmp(v, names[k]) == 0) return k;
    fputs("unknown ZL_MUTANT (see workflow.pml)", stderr);
    exit(2);
}
}
/* Defaults for a replay (spin -t runs no C code: pass the run's values as -DZL_POLICY=... ). */
#ifndef ZL_POLICY
#define ZL_POLICY 0
#endif
#ifndef ZL_POLICY_D
#define ZL_POLICY_D ZL_POLICY
#endif
#ifndef ZL_FANIN
#define ZL_FANIN 2
#endif
#ifndef ZL_BATCH
#define ZL_BATCH 0
#endif
#ifndef ZL_MAXATT
#define ZL_MAXATT 2
#endif
#ifndef ZL_CRASHES
#define ZL_CRASHES 1
#endif
#ifndef ZL_CUTS
#define ZL_CUTS 0
#endif
#ifndef ZL_REQUEUES
#define ZL_REQUEUES 0
#endif
#ifndef ZL_CANCELS
#define ZL_CANCELS 0
#endif
#ifndef ZL_DEADLETTERS
#define ZL_DEADLETTERS 0
#endif
#ifndef ZL_REDRIVES
#define ZL_REDRIVES 1
#endif
#ifndef ZL_MUTANT
#define ZL_MUTANT 0
#endif
byte policy = ZL_POLICY;        /* B's and C's */
byte policy_d = ZL_POLICY_D;    /* D's */
byte fanin = ZL_FANIN;
byte batch = ZL_BATCH;          /* a worker may claim B and C in one batch */
byte maxatt = ZL_MAXATT;
byte crash_budget = ZL_CRASHES;
byte cut_budget = ZL_CUTS;
byte requeue_budget = ZL_REQUEUES;
byte redrive_budget = ZL_REDRIVES;
byte cancel_budget = ZL_CANCELS;
byte deadletter_budget = ZL_DEADLETTERS;
byte mutant = ZL_MUTANT;
#define M_NO_TOKEN 1
#define M_NO_STATUS 2
#define M_NO_EXPIRY 3
#define M_UNLOCKED 4
#define M_SETTLE_TWICE 5
#define M_CANCEL_UNSETTLED 6
#define M_COUNT_ONCE 7
#define M_RELEASE_NOT_WAITING 8
#define M_RELEASE_REFUSED 9

/* failure policies (Message.on_upstream_failure) */
#define WAITP 0
#define RUNP 1
#define CANCELP 2

/* statuses (zeroloss.core.states.Status) */
#define PEND 0
#define PROC 1
#define COMP 2
#define DEAD 3
#define CANC 4
#define WAIT 5

/* an edge's settled column: 0 = '' (unsettled) */
#define S_COMP 1
#define S_DEAD 2
#define S_CANC 3

/* the diamond: each edge's upstream, downstream and fan-in group */
#define EUP(e) ((e) < 2 -> 0 : (e) - 1)
#define EDN(e) ((e) < 2 -> (e) + 1 : 3)
#define EBK(e) ((e) < 3 -> (e) : (fanin == 2 -> 2 : 3))
#define BOWN(b) ((b) < 2 -> (b) + 1 : 3)
/* a step's failure policy */
#define POL(d) ((d) == 3 -> policy_d : policy)
/* Edge e, settled v, counts towards its dependent's release: completed; or ended, under "run". */
#define COUNTS_FOR(e, v) ((v) == S_COMP || ((v) != 0 && POL(EDN(e)) == RUNP))

/* worker phases */
#define IDLE 0
#define RUN 1
#define TX 2
#define TXWAIT 3

/* a transaction's next step */
#define T_BUCKETS 1
#define T_BWRITE 2    /* decrement_unlocked: the groups' counts were read, not locked */
#define T_DEPS 3
#define T_DWRITE 4    /* decrement_unlocked: the steps' counts were read, not locked */
#define T_COMMIT 5

#define ACK 1
#define FAIL 2

/* Transaction slots: worker w's is 2w, or 2w + 1 once it crashed (the first stays open on the
 * server until the server ends it); the last is the sweep's. */
#define SW (W * 2)
#define SLOTS (W * 2 + 1)
#define SLOT(w) ((w) * 2 + crashes[w])
#define IX(w, m) ((w) * NM + (m))
#define BIT(x) (1 << (x))
#define HAS(mask, x) ((((mask) >> (x)) & 1) == 1)

#define MOVE(m, from, to, reason) assert(st[m] == from); st[m] = to

/* -- the ledger (committed state) ------------------------------------------------------------ */
byte st[NM];
byte att[NM];
byte lease[NM];        /* ticks until the lease expires; kept when the row leaves processing */
byte tok[NM];          /* the worker whose claim issued the row's token (W: none yet) */
byte lk[NM];           /* 0, or 1 + the slot of the transaction holding the row's lock */
byte sett[NE];         /* dependency.settled */
byte left[NB];         /* fanin.remaining */
byte lkb[NB];          /* the group row's lock */
byte won[NM];          /* message.waiting_on */

/* -- open transactions: what each wrote, seen by others when it commits ------------------------ */
bool txopen[SLOTS];
byte txph[SLOTS];
byte txm[SLOTS];            /* the rows its outcomes (or the sweep's move) moved, a mask */
byte txnew[SLOTS];          /* the edges this round of its release settled, to count */
byte txbg[SLOTS];           /* the groups this round decremented */
byte txst[SLOTS * NM];      /* 1 + a row's new status */
byte txsv[SLOTS * NE];      /* an edge's new settled value */
byte txbl[SLOTS * NB];      /* 1 + a group's new count */
byte txwo[SLOTS * NM];      /* 1 + a step's new waiting_on */
byte txrd[SLOTS * NB];      /* decrement_unlocked: 1 + a count as read (groups, then steps) */

/* -- workers (lost in a crash) ------------------------------------------------------------- */
byte ph[W];
byte hm[W];            /* the steps it holds (claimed, their handlers running), a mask */
bool cut[W];
byte crashes[W];
byte crashed;
byte cutoffs;
byte requeues;
byte redrives;
byte cancels;
byte deadletters;
bool envop;            /* the environment's transaction is the operator's (else the sweep's) */

/* -- ghosts ---------------------------------------------------------------------------------- */
bool stale[W * NM];    /* w's lease on m: another claim since, expired, or m left processing */
byte rel[NM];          /* releases of each step (waiting -> pending) */

hidden byte i, j, k, n, s, txnext, oc, ofirst;
/* What each assertion checks, by name (spin prints the name of a violated one). */
hidden byte never_early, released_once, counted_right, fresh_lease, from_fenced_move;

/* Unsettled or not counting: what a group still waits for. */
#define UNC(e) (COUNTS_FOR(e, sett[e]) -> 0 : 1)
#define GROUP_LEFT(b) ((b) == 0 -> UNC(0) : ((b) == 1 -> UNC(1) : ((b) == 2 -> UNC(2) + (fanin == 2 -> UNC(3) : 0) : (fanin == 1 -> UNC(3) : 0))))
#define NOT_EMPTY(b) (left[b] > 0 -> 1 : 0)
#define GROUPS_LEFT(d) ((d) == 1 -> NOT_EMPTY(0) : ((d) == 2 -> NOT_EMPTY(1) : NOT_EMPTY(2) + (fanin == 1 -> NOT_EMPTY(3) : 0)))
#define ALL_COUNTED(d) ((d) == 1 -> COUNTS_FOR(0, sett[0]) : ((d) == 2 -> COUNTS_FOR(1, sett[1]) : (COUNTS_FOR(2, sett[2]) && COUNTS_FOR(3, sett[3]))))

/* ROLLBACK: the transaction's writes and locks are gone, its slot free. */
inline rollback(x) {
    for (j : 0 .. NM - 1) {
        txst[x * NM + j] = 0;
        txwo[x * NM + j] = 0;
        if
        :: lk[j] == x + 1 -> lk[j] = 0
        :: else
        fi
    }
    for (j : 0 .. NB - 1) {
        txsv[x * NE + j] = 0;    /* NE == NB */
        txbl[x * NB + j] = 0;
        txrd[x * NB + j] = 0;
        if
        :: lkb[j] == x + 1 -> lkb[j] = 0
        :: else
        fi
    }
    txopen[x] = false;
    txph[x] = 0;
    txm[x] = 0;
    txnew[x] = 0;
    txbg[x] = 0
}

/* After every step: W1-W3 on the committed state. */
inline settle() {
    for (i : 0 .. W * NM - 1) {
        if
        :: !HAS(hm[i / NM], i % NM) -> stale[i] = false    /* read only while w holds m: one state */
        :: else
        fi
    }
    for (i : 0 .. NM - 1) {
        if
        :: st[i] == COMP || st[i] == DEAD || st[i] == CANC ->
            /* read again only after a redrive resets them, or by a fence that refuses a
             * finished row by its status anyway: one state */
            att[i] = 0; tok[i] = W; lease[i] = 0
        :: else
        fi;
        if
        :: i > 0 && st[i] != WAIT && st[i] != CANC ->
            never_early = ALL_COUNTED(i);
            assert(never_early)                                                  /* W1 */
        :: i > 0 && st[i] == WAIT ->
            counted_right = (won[i] == GROUPS_LEFT(i) && won[i] > 0);
            assert(counted_right)                                                /* W3 */
        :: else
        fi
    }
    for (i : 0 .. NB - 1) {
        if
        :: st[BOWN(i)] == WAIT ->
            counted_right = (left[i] == GROUP_LEFT(i));
            assert(counted_right)                                                /* W3 */
        :: else
        fi
    }
    skip
}

/* The row of m left processing: every lease on it is stale. */
inline left_processing(m) {
    for (k : 0 .. W - 1) { stale[IX(k, m)] = true }
}

/* Claim the steps of mask `mask` (one, or B and C in one batch). */
inline claim(w, mask, known) {
    for (k : 0 .. NM - 1) {
        if
        :: HAS(mask, k) ->
            MOVE(k, PEND, PROC, claimed);
            att[k]++;
            tok[k] = w;
            lease[k] = L;
            for (j : 0 .. W - 1) { stale[IX(j, k)] = (j != w) }
        :: else
        fi
    }
    if
    :: known -> hm[w] = mask; ph[w] = RUN
    :: else
    fi
}

/* SETTLE, in transaction t, of the edges of row x, which ended with status ns: those not
 * settled yet (once each: settled = ''), when x completed, was cancelled, or died and the
 * dependent does not wait for a redrive. They are this round's (txnew): counted, or their
 * dependents cancelled, in the statements that follow. */
inline settle_edges(t, x, ns) {
    /* W4: only a row this transaction's fenced statement moved, or a step it cancelled */
    from_fenced_move = (HAS(txm[t], x) || txst[t * NM + x] == CANC + 1);
    assert(from_fenced_move);
    for (k : 0 .. NE - 1) {
        if
        :: EUP(k) == x && (sett[k] == 0 || mutant == M_SETTLE_TWICE) && txsv[t * NE + k] == 0 &&
           (ns == COMP || ns == CANC || (ns == DEAD && POL(EDN(k)) != WAITP)) ->
            txsv[t * NE + k] = (ns == COMP -> S_COMP : (ns == DEAD -> S_DEAD : S_CANC));
            txnew[t] = txnew[t] | BIT(k)
        :: else
        fi
    }
}

/* After SETTLE: a round of release if it settled anything, else COMMIT. */
#define NEXT_ROUND(t) (txnew[t] != 0 -> T_BUCKETS : T_COMMIT)

/* Edge e of this round counts towards its dependent (completed, or ended under "run"). */
#define ROUND(t, e) HAS(txnew[t], e)
#define CNT(t, e) ((ROUND(t, e) && COUNTS_FOR(e, txsv[(t) * NE + (e)])) -> 1 : 0)
/* ... or cancels it (ended, the dependent's policy wait or cancel). */
#define UNCOUNTED(t, e) (ROUND(t, e) && !COUNTS_FOR(e, txsv[(t) * NE + (e)]))
/* How many of this round's counting edges are in group b. */
#define NBK(t, b) (((b) == 0 -> CNT(t, 0) : 0) + ((b) == 1 -> CNT(t, 1) : 0) + ((b) == 2 -> CNT(t, 2) : 0) + (EBK(3) == (b) -> CNT(t, 3) : 0))
/* A group's count as this transaction sees it: its own write, else the committed one. */
#define BVAL(t, b) (txbl[(t) * NB + (b)] != 0 -> txbl[(t) * NB + (b)] - 1 : left[b])
#define BFREE(t, b) (NBK(t, b) == 0 || lkb[b] == 0 || lkb[b] == (t) + 1)
#define BUCKETS_FREE(t) (BFREE(t, 0) && BFREE(t, 1) && BFREE(t, 2) && BFREE(t, 3))

/* count_once: each counter decremented by one, whatever this round settled in it. */
#define ONCE(x) ((mutant == M_COUNT_ONCE && (x) > 1) -> 1 : (x))

/* FANIN_DECREMENT: the groups locked (in order), each count less what this round settles. */
inline buckets(t) {
    for (k : 0 .. NB - 1) {
        n = ONCE(NBK(t, k));
        if
        :: n > 0 -> lkb[k] = t + 1; txbl[t * NB + k] = BVAL(t, k) - n + 1; txbg[t] = txbg[t] | BIT(k)
        :: else
        fi
    }
    n = 0;
    txph[t] = T_DEPS
}

/* decrement_unlocked: the counts read (committed values) without a lock ... */
inline buckets_read(t) {
    for (k : 0 .. NB - 1) {
        if
        :: NBK(t, k) > 0 -> txrd[t * NB + k] = BVAL(t, k) + 1
        :: else
        fi
    }
    txph[t] = T_BWRITE
}

/* ... then written from what was read (the UPDATE waits for the row's lock, not the read). */
inline buckets_write(t) {
    for (k : 0 .. NB - 1) {
        n = ONCE(NBK(t, k));
        if
        :: n > 0 ->
            lkb[k] = t + 1;
            txbl[t * NB + k] = txrd[t * NB + k] - n;
            txrd[t * NB + k] = 0;
            txbg[t] = txbg[t] | BIT(k)
        :: else
        fi
    }
    n = 0;
    txph[t] = T_DEPS
}

/* How many of step d's groups this round emptied. */
#define EMPTIED(t, b) ((HAS(txbg[t], b) && txbl[(t) * NB + (b)] == 1) -> 1 : 0)
#define KD(t, d) ((d) == 1 -> EMPTIED(t, 0) : ((d) == 2 -> EMPTIED(t, 1) : EMPTIED(t, 2) + EMPTIED(t, 3)))
/* Step d has an edge of this round that does not count: it is to be cancelled. */
#define TO_CANCEL(t, d) ((d) == 1 -> UNCOUNTED(t, 0) : ((d) == 2 -> UNCOUNTED(t, 1) : (UNCOUNTED(t, 2) || UNCOUNTED(t, 3))))
/* The rows this round's STEP_DECREMENT and STEP_CANCEL lock. */
#define TOUCHES(t, d) (KD(t, d) > 0 || TO_CANCEL(t, d))
#define DFREE(t, d) (!TOUCHES(t, d) || lk[d] == 0 || lk[d] == (t) + 1)
#define DEPS_FREE(t) (DFREE(t, 1) && DFREE(t, 2) && DFREE(t, 3))
/* A step's status as this transaction sees it. */
#define STV(t, d) (txst[(t) * NM + (d)] != 0 -> txst[(t) * NM + (d)] - 1 : st[d])
#define WOV(t, d) (txwo[(t) * NM + (d)] != 0 -> txwo[(t) * NM + (d)] - 1 : won[d])

/* STEP_DECREMENT (the steps whose group emptied, locked in id order, each count less the
 * groups emptied), STEP_RELEASE (waiting with nothing left -> pending), STEP_CANCEL (waiting,
 * with a dependency ended that does not count -> cancelled); then SETTLE of the steps it
 * cancelled: the next round. With `unlocked`, the counts are the ones read before. */
inline deps(t, unlocked) {
    txnext = 0;
    for (j : 1 .. NM - 1) {
        if
        :: TOUCHES(t, j) ->
            lk[j] = t + 1;
            n = ONCE(KD(t, j));
            if
            :: n > 0 && !unlocked -> txwo[t * NM + j] = WOV(t, j) - n + 1
            :: n > 0 && unlocked -> txwo[t * NM + j] = txrd[t * NB + j] - n; txrd[t * NB + j] = 0
            :: else
            fi;
            if
            :: n > 0 && WOV(t, j) == 0 && (STV(t, j) == WAIT || mutant == M_RELEASE_NOT_WAITING) ->
                txst[t * NM + j] = PEND + 1
            :: else
            fi;
            if
            :: TO_CANCEL(t, j) && STV(t, j) == WAIT -> txst[t * NM + j] = CANC + 1; txnext = txnext | BIT(j)
            :: else
            fi
        :: else
        fi
    }
    n = 0;
    txnew[t] = 0;
    txbg[t] = 0;
    for (j : 1 .. NM - 1) {
        if
        :: HAS(txnext, j) && mutant != M_CANCEL_UNSETTLED -> settle_edges(t, j, CANC)
        :: else
        fi
    }
    txnext = 0;
    txph[t] = NEXT_ROUND(t)
}

/* decrement_unlocked: the steps' counts read without a lock (kept in txrd, by step). */
inline deps_read(t) {
    for (j : 1 .. NM - 1) {
        if
        :: KD(t, j) > 0 -> txrd[t * NB + j] = WOV(t, j) + 1
        :: else
        fi
    }
    txph[t] = T_DWRITE
}

/* COMMIT: the outcome, the settled edges, the counts, the releases, together. */
inline commit(t) {
    for (j : 0 .. NE - 1) {
        if
        :: txsv[t * NE + j] != 0 -> sett[j] = txsv[t * NE + j]
        :: else
        fi;
        if
        :: txbl[t * NB + j] != 0 -> left[j] = txbl[t * NB + j] - 1
        :: else
        fi;
        if
        :: lkb[j] == t + 1 -> lkb[j] = 0
        :: else
        fi
    }
    for (j : 0 .. NM - 1) {
        if
        :: txwo[t * NM + j] != 0 -> won[j] = txwo[t * NM + j] - 1
        :: else
        fi;
        if
        :: HAS(txm[t], j) && txst[t * NM + j] == COMP + 1 -> MOVE(j, PROC, COMP, acknowledged); left_processing(j)
        :: HAS(txm[t], j) && txst[t * NM + j] == DEAD + 1 && t != SW -> MOVE(j, PROC, DEAD, dead_lettered); left_processing(j)
        :: HAS(txm[t], j) && txst[t * NM + j] == PEND + 1 && t != SW -> MOVE(j, PROC, PEND, failed); left_processing(j)
        :: HAS(txm[t], j) && txst[t * NM + j] == DEAD + 1 && t == SW && !envop -> MOVE(j, PROC, DEAD, dead_lettered); left_processing(j)
        :: HAS(txm[t], j) && txst[t * NM + j] == PEND + 1 && t == SW && !envop -> MOVE(j, PROC, PEND, lease_expired); left_processing(j)
        :: HAS(txm[t], j) && txst[t * NM + j] == CANC + 1 && st[j] == PEND -> MOVE(j, PEND, CANC, cancelled_by_operator)
        :: HAS(txm[t], j) && txst[t * NM + j] == CANC + 1 && st[j] == WAIT -> MOVE(j, WAIT, CANC, cancelled_by_operator)
        :: HAS(txm[t], j) && txst[t * NM + j] == DEAD + 1 && t == SW && envop && st[j] == PEND ->
            MOVE(j, PEND, DEAD, dead_lettered_by_operator)
        :: HAS(txm[t], j) && txst[t * NM + j] == DEAD + 1 && t == SW && envop && st[j] == PROC ->
            MOVE(j, PROC, DEAD, dead_lettered_by_operator); left_processing(j)
        :: !HAS(txm[t], j) && txst[t * NM + j] == PEND + 1 ->
            released_once = (st[j] == WAIT && rel[j] == 0);
            assert(released_once);                                               /* W2 */
            MOVE(j, WAIT, PEND, dependencies_completed);
            rel[j]++
        :: !HAS(txm[t], j) && txst[t * NM + j] == CANC + 1 -> MOVE(j, WAIT, CANC, upstream_failed)
        :: else
        fi;
        if
        :: lk[j] == t + 1 -> lk[j] = 0
        :: else
        fi
    }
    rollback(t)    /* the slot is free: nothing of it is left to undo */
}

/* The outcome's fence (statements.py: token, processing, unexpired; the row's lock waited for). */
#define FENCE(w, m) ((tok[m] == w || mutant == M_NO_TOKEN) && (st[m] == PROC || mutant == M_NO_STATUS) && (lease[m] > 0 || mutant == M_NO_EXPIRY))

/* BEGIN, the batch's fenced outcome statements (each row fenced: first's outcome `oa`, the
 * second's `ob`), SETTLE (the edges of the rows they moved: no other transaction can write
 * them, it holds those rows). A batch refused whole ends there. */
inline outcome(w, oa, ob) {
    s = SLOT(w);
    assert(!txopen[s]);
    ofirst = true;
    for (n : 0 .. NM - 1) {
        if
        :: HAS(hm[w], n) ->
            oc = (ofirst -> oa : ob);
            ofirst = false;
            if
            :: FENCE(w, n) ->
                fresh_lease = !stale[IX(w, n)];
                assert(fresh_lease);                                             /* W4 */
                txopen[s] = true;
                txm[s] = txm[s] | BIT(n);
                lk[n] = s + 1;
                if
                :: oc == ACK -> txst[s * NM + n] = COMP + 1; settle_edges(s, n, COMP)
                :: oc == FAIL && att[n] >= maxatt -> txst[s * NM + n] = DEAD + 1; settle_edges(s, n, DEAD)
                :: oc == FAIL && att[n] < maxatt -> txst[s * NM + n] = PEND + 1
                fi
            :: !FENCE(w, n) && mutant == M_RELEASE_REFUSED && oc == ACK ->
                /* the release run for the row submitted, not for the rows the statement moved */
                txopen[s] = true;
                settle_edges(s, n, COMP)
            :: else    /* refused: this row's lease was lost */
            fi
        :: else
        fi
    }
    if
    :: txopen[s] -> txph[s] = NEXT_ROUND(s); ph[w] = TX
    :: else -> ph[w] = IDLE
    fi;
    hm[w] = 0;
    n = 0;
    oc = 0;
    ofirst = false
}

/* The rows locked (a held row's lock is waited for before its outcome statement). */
#define LOCKED ((lk[0] != 0 -> 1 : 0) | (lk[1] != 0 -> 2 : 0) | (lk[2] != 0 -> 4 : 0) | (lk[3] != 0 -> 8 : 0))
#define RETURNS(w) (ph[w] == RUN && !cut[w] && (hm[w] & LOCKED) == 0)
#define BATCH_BC (BIT(1) | BIT(2))

#define MINE (SLOT(w))
#define IN_TX (ph[w] == TX && txopen[MINE])
#define CLAIMABLE(m) (st[m] == PEND && lk[m] == 0)

proctype worker(byte w) {
end:
    do
    :: d_step { ph[w] == IDLE && CLAIMABLE(0) -> claim(w, BIT(0), !cut[w]); settle() }
    :: d_step { ph[w] == IDLE && CLAIMABLE(1) -> claim(w, BIT(1), !cut[w]); settle() }
    :: d_step { ph[w] == IDLE && CLAIMABLE(2) -> claim(w, BIT(2), !cut[w]); settle() }
    :: d_step { ph[w] == IDLE && CLAIMABLE(3) -> claim(w, BIT(3), !cut[w]); settle() }
    :: d_step { ph[w] == IDLE && batch && CLAIMABLE(1) && CLAIMABLE(2) -> claim(w, BATCH_BC, !cut[w]); settle() }
    /* The handlers return (after any number of ticks); the batch's outcome statements. */
    :: d_step { RETURNS(w) -> outcome(w, ACK, ACK); settle() }
    :: d_step { RETURNS(w) -> outcome(w, FAIL, FAIL); settle() }
    :: d_step { RETURNS(w) && hm[w] == BATCH_BC -> outcome(w, ACK, FAIL); settle() }
    :: d_step { RETURNS(w) && hm[w] == BATCH_BC -> outcome(w, FAIL, ACK); settle() }
    /* The release's statements, then COMMIT. */
    :: d_step { IN_TX && !cut[w] && txph[MINE] == T_BUCKETS && mutant != M_UNLOCKED && BUCKETS_FREE(MINE) -> buckets(MINE); settle() }
    :: d_step { IN_TX && !cut[w] && txph[MINE] == T_BUCKETS && mutant == M_UNLOCKED -> buckets_read(MINE); settle() }
    :: d_step { IN_TX && !cut[w] && txph[MINE] == T_BWRITE && BUCKETS_FREE(MINE) -> buckets_write(MINE); settle() }
    :: d_step { IN_TX && !cut[w] && txph[MINE] == T_DEPS && mutant != M_UNLOCKED && DEPS_FREE(MINE) -> deps(MINE, false); settle() }
    :: d_step { IN_TX && !cut[w] && txph[MINE] == T_DEPS && mutant == M_UNLOCKED -> deps_read(MINE); settle() }
    :: d_step { IN_TX && !cut[w] && txph[MINE] == T_DWRITE && DEPS_FREE(MINE) -> deps(MINE, true); settle() }
    :: d_step { IN_TX && !cut[w] && txph[MINE] == T_COMMIT -> commit(MINE); ph[w] = IDLE; settle() }
    /* Cut off: the handler's outcome cannot be sent (the lease runs out); a COMMIT lands with
     * its answer lost; any other statement is lost, and the transaction stays open on the
     * server until the server ends it. */
    :: d_step { ph[w] == RUN && cut[w] -> hm[w] = 0; ph[w] = IDLE }
    :: d_step { IN_TX && cut[w] && txph[MINE] == T_COMMIT -> commit(MINE); ph[w] = IDLE; settle() }
    :: d_step { IN_TX && cut[w] -> ph[w] = TXWAIT }
    :: d_step { ph[w] == TXWAIT && !txopen[MINE] -> ph[w] = IDLE }
    /* A crash: its state is gone; its transaction stays open in its slot until the server
     * ends it. */
    :: d_step { crashed < crash_budget && crashes[w] == 0 -> crashed++; crashes[w]++; hm[w] = 0; ph[w] = IDLE; settle() }
    :: d_step { !cut[w] && cutoffs < cut_budget -> cut[w] = true; cutoffs++ }
    :: d_step { cut[w] -> cut[w] = false }
    od
}

#define TICKING (lease[0] + lease[1] + lease[2] + lease[3] > 0)
/* Slot x's transaction is open and its worker gone: crashed since, or gave it up. */
#define ABANDONED(x) (txopen[x] && (SLOT((x) / 2) != (x) || ph[(x) / 2] == TXWAIT))
#define ANY_ABANDONED (ABANDONED(0) || ABANDONED(1) || ABANDONED(2) || ABANDONED(3))
#define SWEEPABLE(m) (st[m] == PROC && lease[m] == 0 && lk[m] == 0)
#define SWEEP_ANY (SWEEPABLE(0) || SWEEPABLE(1) || SWEEPABLE(2) || SWEEPABLE(3))
/* The operator's cancel and dead-lettering (each waits for the row's lock). */
#define CANCELLABLE(m) ((st[m] == PEND || st[m] == WAIT) && lk[m] == 0)
#define KILLABLE(m) ((st[m] == PEND || st[m] == PROC) && lk[m] == 0)

/* The sweep: an expired processing row, not locked (SKIP LOCKED), to pending, or dead once its
 * attempts are spent, with the release of a dead step's dependents in its transaction. */
inline sweep(m) {
    envop = false;
    txopen[SW] = true;
    txm[SW] = BIT(m);
    lk[m] = SW + 1;
    if
    :: att[m] >= maxatt -> txst[SW * NM + m] = DEAD + 1; settle_edges(SW, m, DEAD); txph[SW] = NEXT_ROUND(SW)
    :: else -> txst[SW * NM + m] = PEND + 1; txph[SW] = T_COMMIT
    fi;
    if
    :: txph[SW] == T_COMMIT -> commit(SW)
    :: else
    fi
}

/* The operator cancels a pending step (CANCEL), or a waiting one (STEP_CANCEL_BY_OPERATOR, as
 * cancel_workflow does), or dead-letters a pending or running one (DEAD_LETTER_PENDING,
 * DEAD_LETTER_PROCESSING, whatever its lease): in its transaction, the step's dependents are
 * settled as for any ended step. */
inline operator_ends(m, ns) {
    envop = true;
    txopen[SW] = true;
    txm[SW] = BIT(m);
    lk[m] = SW + 1;
    txst[SW * NM + m] = ns + 1;
    settle_edges(SW, m, ns);
    txph[SW] = NEXT_ROUND(SW);
    if
    :: txph[SW] == T_COMMIT -> commit(SW)
    :: else
    fi
}

inline requeue(m) {
    requeues++;
    MOVE(m, PROC, PEND, requeued_by_operator);
    left_processing(m);
    att[m] = 0
}

inline redrive(m) {
    redrives++;
    MOVE(m, DEAD, PEND, redriven_by_operator);
    att[m] = 0
}

active proctype environment() {
end:
    do
    /* The database clock. */
    :: d_step {
        TICKING ->
        for (i : 0 .. NM - 1) {
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
        settle()
    }
    :: d_step { !TICKING && !SWEEP_ANY && !txopen[SW] && !ANY_ABANDONED -> skip }
    /* The server ends the transaction of a worker that is gone (its session's keepalives). */
    :: d_step { ABANDONED(0) -> rollback(0); settle() }
    :: d_step { ABANDONED(1) -> rollback(1); settle() }
    :: d_step { ABANDONED(2) -> rollback(2); settle() }
    :: d_step { ABANDONED(3) -> rollback(3); settle() }
    :: d_step { !txopen[SW] && SWEEPABLE(0) -> sweep(0); settle() }
    :: d_step { !txopen[SW] && SWEEPABLE(1) -> sweep(1); settle() }
    :: d_step { !txopen[SW] && SWEEPABLE(2) -> sweep(2); settle() }
    :: d_step { !txopen[SW] && SWEEPABLE(3) -> sweep(3); settle() }
    :: d_step { txph[SW] == T_BUCKETS && mutant != M_UNLOCKED && BUCKETS_FREE(SW) -> buckets(SW); settle() }
    :: d_step { txph[SW] == T_BUCKETS && mutant == M_UNLOCKED -> buckets_read(SW); settle() }
    :: d_step { txph[SW] == T_BWRITE && BUCKETS_FREE(SW) -> buckets_write(SW); settle() }
    :: d_step { txph[SW] == T_DEPS && mutant != M_UNLOCKED && DEPS_FREE(SW) -> deps(SW, false); settle() }
    :: d_step { txph[SW] == T_DEPS && mutant == M_UNLOCKED -> deps_read(SW); settle() }
    :: d_step { txph[SW] == T_DWRITE && DEPS_FREE(SW) -> deps(SW, true); settle() }
    :: d_step { txph[SW] == T_COMMIT -> commit(SW); settle() }
    /* The operator: a force requeue (processing, whatever its lease; it waits for the row's
     * lock) and a redrive (dead). */
    :: d_step { requeues < requeue_budget && st[0] == PROC && lk[0] == 0 -> requeue(0); settle() }
    :: d_step { requeues < requeue_budget && st[1] == PROC && lk[1] == 0 -> requeue(1); settle() }
    :: d_step { requeues < requeue_budget && st[2] == PROC && lk[2] == 0 -> requeue(2); settle() }
    :: d_step { requeues < requeue_budget && st[3] == PROC && lk[3] == 0 -> requeue(3); settle() }
    :: d_step { redrives < redrive_budget && st[0] == DEAD && lk[0] == 0 -> redrive(0); settle() }
    :: d_step { redrives < redrive_budget && st[1] == DEAD && lk[1] == 0 -> redrive(1); settle() }
    :: d_step { redrives < redrive_budget && st[2] == DEAD && lk[2] == 0 -> redrive(2); settle() }
    :: d_step { redrives < redrive_budget && st[3] == DEAD && lk[3] == 0 -> redrive(3); settle() }
    :: d_step { !txopen[SW] && cancels < cancel_budget && CANCELLABLE(0) -> cancels++; operator_ends(0, CANC); settle() }
    :: d_step { !txopen[SW] && cancels < cancel_budget && CANCELLABLE(1) -> cancels++; operator_ends(1, CANC); settle() }
    :: d_step { !txopen[SW] && cancels < cancel_budget && CANCELLABLE(2) -> cancels++; operator_ends(2, CANC); settle() }
    :: d_step { !txopen[SW] && cancels < cancel_budget && CANCELLABLE(3) -> cancels++; operator_ends(3, CANC); settle() }
    :: d_step { !txopen[SW] && deadletters < deadletter_budget && KILLABLE(0) -> deadletters++; operator_ends(0, DEAD); settle() }
    :: d_step { !txopen[SW] && deadletters < deadletter_budget && KILLABLE(1) -> deadletters++; operator_ends(1, DEAD); settle() }
    :: d_step { !txopen[SW] && deadletters < deadletter_budget && KILLABLE(2) -> deadletters++; operator_ends(2, DEAD); settle() }
    :: d_step { !txopen[SW] && deadletters < deadletter_budget && KILLABLE(3) -> deadletters++; operator_ends(3, DEAD); settle() }
    od
}

init {
    atomic {
        c_code {
            now.policy = zl_env("ZL_POLICY", now.policy);
            now.policy_d = zl_env("ZL_POLICY_D", now.policy);
            now.fanin = zl_env("ZL_FANIN", now.fanin);
            now.batch = zl_env("ZL_BATCH", now.batch);
            now.maxatt = zl_env("ZL_MAXATT", now.maxatt);
            now.crash_budget = zl_env("ZL_CRASHES", now.crash_budget);
            now.cut_budget = zl_env("ZL_CUTS", now.cut_budget);
            now.requeue_budget = zl_env("ZL_REQUEUES", now.requeue_budget);
            now.redrive_budget = zl_env("ZL_REDRIVES", now.redrive_budget);
            now.cancel_budget = zl_env("ZL_CANCELS", now.cancel_budget);
            now.deadletter_budget = zl_env("ZL_DEADLETTERS", now.deadletter_budget);
            now.mutant = zl_mutant(now.mutant);
        };
        /* The workflow, stored whole: A pending; B, C, D waiting on their groups. */
        st[1] = WAIT; st[2] = WAIT; st[3] = WAIT;
        for (i : 0 .. NM - 1) { tok[i] = W }
        left[0] = 1;
        left[1] = 1;
        left[2] = (fanin == 2 -> 2 : 1);
        left[3] = (fanin == 2 -> 0 : 1);
        won[1] = 1;
        won[2] = 1;
        won[3] = (fanin == 2 -> 1 : 2);
        for (i : 0 .. W - 1) { run worker(i) }
        i = 0
    }
}

#define TERM(m) (st[m] == COMP || st[m] == DEAD || st[m] == CANC)
/* Waiting for a redrive: behind a dead dependency under "wait", or behind a step that is. */
#define BLK1 (st[1] == WAIT && policy == WAITP && st[0] == DEAD)
#define BLK2 (st[2] == WAIT && policy == WAITP && st[0] == DEAD)
#define BLK3 (st[3] == WAIT && ((policy_d == WAITP && (st[1] == DEAD || st[2] == DEAD)) || BLK1 || BLK2))
/* W5. (Run with -a -f.) */
ltl done { <> [] (TERM(0) && (TERM(1) || BLK1) && (TERM(2) || BLK2) && (TERM(3) || BLK3)) }
/* A claim for the safety run (assertions only). */
ltl safety { [] (st[0] <= WAIT) }
