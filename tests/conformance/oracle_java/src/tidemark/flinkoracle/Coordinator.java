package tidemark.flinkoracle;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Drives one oracle case in lockstep so that Flink's result is deterministic.
 *
 * <p>Why: with two source tables, a join task reads two input channels and picks whichever
 * has data, so the order in which it sees records of different tables (and hence the order
 * of rows reaching the sink materializer, which decides DEDUPLICATE's "latest" row and
 * NOTHING's "first" row) depends on timing. The coordinator releases the global record
 * sequence one step at a time:
 *
 * <ul>
 *   <li>Consecutive records of the same table travel one FIFO channel and need no sync.
 *   <li>Before a record of another table is released, a checkpoint must complete whose
 *       barrier followed the previous record: with aligned checkpoints that proves every
 *       operator has processed it. Checkpoints carry no data, so they do not change what
 *       the materializers compute.
 *   <li>A batch ends with watermark {@code i} emitted by every source; the next batch is
 *       released only after the sink has seen watermark {@code i} (the watermark-compacting
 *       materializer compacts exactly the batch's records on it) and snapshotted its table.
 * </ul>
 *
 * <p>Lives in the JVM's system class path (not in a job jar) so that sources, the sink and the
 * Python driver (through py4j) share the one static registry.
 */
public final class Coordinator {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Map<String, Coordinator> CASES = new ConcurrentHashMap<>();

    /** One input event: a record of a table, or the end of a batch (table == null). */
    static final class Event {
        final String table;
        final String kind;
        final JsonNode row;
        final int batch;

        Event(String table, String kind, JsonNode row, int batch) {
            this.table = table;
            this.kind = kind;
            this.row = row;
            this.batch = batch;
        }
    }

    private final List<Event> events = new ArrayList<>();
    private final Set<String> tables = new HashSet<>();
    // the tables the planned job actually scans (a table the query does not read has no reader)
    private final Set<String> scanned = new HashSet<>();
    private int cursor = 0;
    // checkpoint sync after a record whose successor belongs to another table
    private boolean syncPending = false;
    private String syncOwner = null;
    private long syncCheckpoint = -1;
    private final Map<Integer, Set<String>> watermarksEmitted = new HashMap<>();
    private long sinkWatermark = Long.MIN_VALUE;
    // a statement set's sinks (script "sinks"): each must see a batch's watermark; snapshots
    // and changes then name their sink. Empty: the one sink of a single INSERT.
    private final Set<String> sinks = new HashSet<>();
    private final Map<String, Long> sinkWatermarks = new HashMap<>();
    private final ArrayNode snapshots = JSON.createArrayNode();
    private final ArrayNode sinkChangelog = JSON.createArrayNode();
    private CompletableFuture<Void> changed = new CompletableFuture<>();
    private int checkpointSyncs = 0;
    private String jobId = null;
    private long lastCompleted = -1;
    private final StringBuilder problems = new StringBuilder();
    private static final java.util.concurrent.ScheduledExecutorService RETRY =
            java.util.concurrent.Executors.newSingleThreadScheduledExecutor(r -> {
                Thread t = new Thread(r, "tidemark-oracle-checkpoint-retry");
                t.setDaemon(true);
                return t;
            });

    /**
     * Registers a case. {@code scriptJson} is {"tables": [names], "batches": [[{"table", "kind",
     * "row": [values]}...]...]}; records inside a batch are released in list order.
     */
    public static void register(String caseId, String scriptJson) throws Exception {
        JsonNode script = JSON.readTree(scriptJson);
        Coordinator c = new Coordinator();
        for (JsonNode t : script.get("tables")) {
            c.tables.add(t.asText());
        }
        if (script.has("sinks")) {
            for (JsonNode t : script.get("sinks")) {
                c.sinks.add(t.asText());
            }
        }
        int batchNo = 0;
        for (JsonNode batch : script.get("batches")) {
            batchNo++;
            for (JsonNode rec : batch) {
                String table = rec.get("table").asText();
                if (!c.tables.contains(table)) {
                    throw new IllegalArgumentException("record for unknown table " + table);
                }
                c.events.add(new Event(table, rec.get("kind").asText(), rec.get("row"), batchNo));
            }
            c.events.add(new Event(null, null, null, batchNo));
        }
        CASES.put(caseId, c);
    }

    /** The sink snapshots and changelog of a case, as JSON; forgets the case. */
    public static String takeResult(String caseId) throws Exception {
        Coordinator c = CASES.remove(caseId);
        if (c == null) {
            throw new IllegalArgumentException("unknown case " + caseId);
        }
        synchronized (c) {
            ObjectNode out = JSON.createObjectNode();
            out.set("snapshots", c.snapshots);
            out.set("changelog", c.sinkChangelog);
            out.put("released", c.cursor);
            out.put("events", c.events.size());
            out.put("checkpoint_syncs", c.checkpointSyncs);
            out.put("problems", c.problems.toString());
            out.put("state", "cursor=" + c.cursor + " syncPending=" + c.syncPending + " syncOwner=" + c.syncOwner
                    + " syncCheckpoint=" + c.syncCheckpoint + " lastCompleted=" + c.lastCompleted
                    + " jobId=" + c.jobId + " sinkWatermark=" + c.sinkWatermark
                    + " watermarksEmitted=" + c.watermarksEmitted + " scanned=" + c.scanned);
            return JSON.writeValueAsString(out);
        }
    }

    /** Called while Flink translates the plan, once per scan of {@code table}. */
    static void expectSource(String caseId, String table) {
        Coordinator c = get(caseId);
        synchronized (c) {
            c.scanned.add(table);
        }
    }

    static Coordinator get(String caseId) {
        Coordinator c = CASES.get(caseId);
        if (c == null) {
            throw new IllegalStateException("tidemark-oracle: case '" + caseId + "' not registered");
        }
        return c;
    }

    private void signal() {
        CompletableFuture<Void> old = changed;
        changed = new CompletableFuture<>();
        old.complete(null);
    }

    synchronized CompletableFuture<Void> changedFuture() {
        return changed;
    }

    /** What a source reader of {@code table} should do next. */
    static final class Step {
        static final Step WAIT = new Step(null, -1, false);
        static final Step END = new Step(null, -1, true);
        final Event record;
        final long watermark;
        final boolean end;

        Step(Event record, long watermark, boolean end) {
            this.record = record;
            this.watermark = watermark;
            this.end = end;
        }
    }

    synchronized Step next(String table) {
        while (true) {
            if (cursor >= events.size()) {
                return Step.END;
            }
            Event ev = events.get(cursor);
            if (ev.table != null && !scanned.contains(ev.table)) {
                cursor++;  // the query does not read this table
                continue;
            }
            if (ev.table != null) {
                if (!ev.table.equals(table) || syncPending) {
                    return Step.WAIT;
                }
                cursor++;
                int n = cursor;
                while (n < events.size() && events.get(n).table != null && !scanned.contains(events.get(n).table)) {
                    n++;
                }
                if (n < events.size()) {
                    Event nxt = events.get(n);
                    if (nxt.table != null && !nxt.table.equals(table)) {
                        syncPending = true;
                        syncOwner = table;
                        syncCheckpoint = -1;
                        checkpointSyncs++;
                        requestCheckpoint();
                    }
                }
                signal();
                return new Step(ev, -1, false);
            }
            // end of batch ev.batch: every source emits watermark ev.batch, then the sink must see it
            Set<String> emitted = watermarksEmitted.computeIfAbsent(ev.batch, k -> new HashSet<>());
            if (!emitted.contains(table)) {
                emitted.add(table);
                signal();
                return new Step(null, ev.batch, false);
            }
            if (emitted.containsAll(scanned) && sinkWatermark >= ev.batch) {
                cursor++;
                signal();
                continue;
            }
            return Step.WAIT;
        }
    }

    /** A reader reports the job it runs in, so the coordinator can ask for checkpoints. */
    synchronized void setJobId(String id) {
        if (jobId == null) {
            jobId = id;
            if (syncPending && syncCheckpoint < 0) {
                requestCheckpoint();
            }
        }
    }

    /**
     * Checkpoints are triggered on demand (periodic ones every few ms would cost the whole
     * machine). A trigger can fail while tasks are still starting: retry until the sync holds.
     */
    private void requestCheckpoint() {
        if (jobId == null) {
            return;  // setJobId will ask
        }
        SessionCluster.triggerCheckpoint(jobId).whenComplete((id, err) -> {
            if (err != null) {
                synchronized (Coordinator.this) {
                    if (syncPending && syncCheckpoint < 0) {
                        if (problems.length() < 2000) {
                            problems.append("checkpoint trigger failed: ").append(err).append('\n');
                        }
                        RETRY.schedule(() -> {
                            synchronized (Coordinator.this) {
                                if (syncPending && syncCheckpoint < 0) {
                                    requestCheckpoint();
                                }
                            }
                        }, 5, java.util.concurrent.TimeUnit.MILLISECONDS);
                    }
                }
            }
        });
    }

    synchronized void onCheckpointAborted(long checkpointId) {
        if (syncPending && syncCheckpoint == checkpointId) {
            syncCheckpoint = -1;
            requestCheckpoint();
        }
    }

    /** Called by a reader of {@code table} as its checkpoint barrier {@code checkpointId} is emitted. */
    synchronized void onSnapshot(String table, long checkpointId) {
        if (syncPending && table.equals(syncOwner) && syncCheckpoint < 0) {
            syncCheckpoint = checkpointId;
        }
    }

    synchronized void onCheckpointComplete(long checkpointId) {
        lastCompleted = Math.max(lastCompleted, checkpointId);
        if (syncPending && syncCheckpoint >= 0 && checkpointId >= syncCheckpoint) {
            syncPending = false;
            syncOwner = null;
            syncCheckpoint = -1;
            signal();
        }
    }

    synchronized void onSinkChange(String sink, String kind, ArrayNode row) {
        ObjectNode ch = JSON.createObjectNode();
        if (!sinks.isEmpty()) {
            ch.put("sink", sink);
        }
        ch.put("kind", kind);
        ch.set("row", row);
        sinkChangelog.add(ch);
    }

    synchronized void onSinkWatermark(String sink, long watermark, ArrayNode table) {
        ObjectNode snap = JSON.createObjectNode();
        if (!sinks.isEmpty()) {
            snap.put("sink", sink);
        }
        snap.put("watermark", watermark);
        snap.put("changes", sinkChangelog.size());
        snap.set("table", table);
        snapshots.add(snap);
        sinkWatermarks.merge(sink, watermark, Math::max);
        // the slowest sink paces the lockstep
        if (sinks.isEmpty() || sinkWatermarks.keySet().containsAll(sinks)) {
            long slowest = Long.MAX_VALUE;
            for (long w : sinkWatermarks.values()) {
                slowest = Math.min(slowest, w);
            }
            sinkWatermark = Math.max(sinkWatermark, slowest);
        }
        signal();
    }
}
