package tidemark.flinkoracle;

import org.apache.flink.api.connector.source.Boundedness;
import org.apache.flink.api.connector.source.ReaderOutput;
import org.apache.flink.api.connector.source.Source;
import org.apache.flink.api.connector.source.SourceReader;
import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.api.connector.source.SourceSplit;
import org.apache.flink.api.connector.source.SplitEnumerator;
import org.apache.flink.api.connector.source.SplitEnumeratorContext;
import org.apache.flink.api.common.eventtime.Watermark;
import org.apache.flink.core.io.InputStatus;
import org.apache.flink.core.io.SimpleVersionedSerializer;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.types.logical.LogicalType;

import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/** A source that replays one table's records of a case as the {@link Coordinator} releases them. */
public final class OracleSource implements Source<RowData, OracleSource.NoSplit, Void> {
    private static final long serialVersionUID = 1L;

    private final String caseId;
    private final String table;
    private final LogicalType[] types;

    OracleSource(String caseId, String table, LogicalType[] types) {
        this.caseId = caseId;
        this.table = table;
        this.types = types;
    }

    @Override
    public Boundedness getBoundedness() {
        return Boundedness.BOUNDED;
    }

    @Override
    public SourceReader<RowData, NoSplit> createReader(SourceReaderContext ctx) {
        Coordinator coord = Coordinator.get(caseId);
        String jobId = ctx.metricGroup().getAllVariables().get("<job_id>");
        if (jobId != null) {
            coord.setJobId(jobId);
        }
        return new Reader(coord, table, types);
    }

    @Override
    public SplitEnumerator<NoSplit, Void> createEnumerator(SplitEnumeratorContext<NoSplit> ctx) {
        return new NoEnumerator();
    }

    @Override
    public SplitEnumerator<NoSplit, Void> restoreEnumerator(SplitEnumeratorContext<NoSplit> ctx, Void s) {
        return new NoEnumerator();
    }

    @Override
    public SimpleVersionedSerializer<NoSplit> getSplitSerializer() {
        return new EmptySerializer<>(new NoSplit());
    }

    @Override
    public SimpleVersionedSerializer<Void> getEnumeratorCheckpointSerializer() {
        return new EmptySerializer<>(null);
    }

    /** The reader needs no splits: the coordinator hands it its records. */
    public static final class NoSplit implements SourceSplit {
        @Override
        public String splitId() {
            return "0";
        }
    }

    static final class EmptySerializer<T> implements SimpleVersionedSerializer<T> {
        private final T value;

        EmptySerializer(T value) {
            this.value = value;
        }

        @Override
        public int getVersion() {
            return 1;
        }

        @Override
        public byte[] serialize(T obj) {
            return new byte[0];
        }

        @Override
        public T deserialize(int version, byte[] serialized) {
            return value;
        }
    }

    static final class NoEnumerator implements SplitEnumerator<NoSplit, Void> {
        @Override
        public void start() {}

        @Override
        public void handleSplitRequest(int subtaskId, String host) {}

        @Override
        public void addSplitsBack(List<NoSplit> splits, int subtaskId) {}

        @Override
        public void addReader(int subtaskId) {}

        @Override
        public Void snapshotState(long checkpointId) {
            return null;
        }

        @Override
        public void close() {}
    }

    static final class Reader implements SourceReader<RowData, NoSplit> {
        private final Coordinator coord;
        private final String table;
        private final LogicalType[] types;
        private CompletableFuture<Void> available = CompletableFuture.completedFuture(null);

        Reader(Coordinator coord, String table, LogicalType[] types) {
            this.coord = coord;
            this.table = table;
            this.types = types;
        }

        @Override
        public void start() {}

        @Override
        public InputStatus pollNext(ReaderOutput<RowData> output) {
            // take the future before asking, so a change between the two is not lost
            CompletableFuture<Void> changed = coord.changedFuture();
            Coordinator.Step step = coord.next(table);
            if (step.end) {
                return InputStatus.END_OF_INPUT;
            }
            if (step.record != null) {
                output.collect(Rows.toRowData(step.record.kind, step.record.row, types, table));
                return InputStatus.MORE_AVAILABLE;
            }
            if (step.watermark >= 0) {
                output.emitWatermark(new Watermark(step.watermark));
                return InputStatus.MORE_AVAILABLE;
            }
            available = changed;
            return InputStatus.NOTHING_AVAILABLE;
        }

        @Override
        public List<NoSplit> snapshotState(long checkpointId) {
            coord.onSnapshot(table, checkpointId);
            return Collections.emptyList();
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            coord.onCheckpointComplete(checkpointId);
        }

        @Override
        public void notifyCheckpointAborted(long checkpointId) {
            coord.onCheckpointAborted(checkpointId);
        }

        @Override
        public CompletableFuture<Void> isAvailable() {
            return available;
        }

        @Override
        public void addSplits(List<NoSplit> splits) {}

        @Override
        public void notifyNoMoreSplits() {}

        @Override
        public void close() {}
    }
}
