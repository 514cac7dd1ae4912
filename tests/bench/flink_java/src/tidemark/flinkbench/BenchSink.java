package tidemark.flinkbench;

import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.flink.table.data.DecimalData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.types.RowKind;

import java.io.File;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/** The writer side of {@link BenchSinkFactory}. */
public final class BenchSink implements Sink<RowData> {
    private static final long serialVersionUID = 1L;

    private final String dir;
    private final boolean materialize;
    private final LogicalType[] types;
    private final int[] pk;

    BenchSink(String dir, boolean materialize, LogicalType[] types, int[] pk) {
        this.dir = dir;
        this.materialize = materialize;
        this.types = types;
        this.pk = pk;
    }

    @Override
    public SinkWriter<RowData> createWriter(WriterInitContext context) {
        return new Writer(this, context.getTaskInfo().getIndexOfThisSubtask());
    }

    static final class Writer implements SinkWriter<RowData> {
        private final BenchSink sink;
        private final int subtask;
        private final RowData.FieldGetter[] getters;
        private final Map<List<Object>, Object[]> table = new HashMap<>();
        private long changes;
        private long firstMs = -1;
        private long lastMs = -1;

        Writer(BenchSink sink, int subtask) {
            this.sink = sink;
            this.subtask = subtask;
            this.getters = new RowData.FieldGetter[sink.types.length];
            for (int i = 0; i < getters.length; i++) {
                getters[i] = RowData.createFieldGetter(sink.types[i], i);
            }
        }

        @Override
        public void write(RowData element, Context context) {
            changes++;
            if (firstMs < 0) {
                firstMs = System.currentTimeMillis();
            }
            if (!sink.materialize) {
                return;
            }
            Object[] row = new Object[getters.length];
            for (int i = 0; i < row.length; i++) {
                row[i] = external(getters[i].getFieldOrNull(element));
            }
            Object[] key = new Object[sink.pk.length];
            for (int i = 0; i < key.length; i++) {
                key[i] = row[sink.pk[i]];
            }
            RowKind kind = element.getRowKind();
            if (kind == RowKind.INSERT || kind == RowKind.UPDATE_AFTER) {
                table.put(Arrays.asList(key), row);
            } else {
                table.remove(Arrays.asList(key));
            }
        }

        private static Object external(Object v) {
            if (v instanceof StringData) {
                return v.toString();
            }
            if (v instanceof DecimalData) {
                return ((DecimalData) v).toBigDecimal().toPlainString();
            }
            return v; // Long, Integer, Double, Boolean, ...: JSON-native
        }

        @Override
        public void flush(boolean endOfInput) throws java.io.IOException {
            if (!endOfInput) {
                return;
            }
            lastMs = System.currentTimeMillis();
            ObjectMapper json = new ObjectMapper();
            ObjectNode out = json.createObjectNode();
            out.put("subtask", subtask);
            out.put("changes", changes);
            out.put("first_write_ms", firstMs);
            out.put("end_of_input_ms", lastMs);
            out.put("materialized", sink.materialize);
            ArrayNode rows = out.putArray("rows");
            for (Object[] row : new ArrayList<>(table.values())) {
                rows.add(json.valueToTree(row));
            }
            File tmp = new File(sink.dir, "part-" + subtask + ".json.tmp");
            json.writeValue(tmp, out);
            if (!tmp.renameTo(new File(sink.dir, "part-" + subtask + ".json"))) {
                throw new java.io.IOException("cannot rename " + tmp);
            }
        }

        @Override
        public void close() {}
    }
}
