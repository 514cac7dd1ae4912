package tidemark.flinkoracle;

import org.apache.flink.api.common.eventtime.Watermark;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.types.RowKind;

import java.util.Map;
import java.util.TreeMap;

/**
 * An upsert sink that materializes what Flink writes into a table keyed by the sink's primary
 * key (what a compacted topic or a database would hold), and snapshots it on every watermark.
 */
public final class OracleSink implements Sink<RowData> {
    private static final long serialVersionUID = 1L;
    private static final ObjectMapper JSON = new ObjectMapper();

    private final String caseId;
    private final String name;
    private final LogicalType[] types;
    private final int[] pk;

    OracleSink(String caseId, String name, LogicalType[] types, int[] pk) {
        this.caseId = caseId;
        this.name = name;
        this.types = types;
        this.pk = pk;
    }

    @Override
    public SinkWriter<RowData> createWriter(WriterInitContext context) {
        return new Writer(Coordinator.get(caseId), name, types, pk);
    }

    static final class Writer implements SinkWriter<RowData> {
        private final Coordinator coord;
        private final String name;
        private final LogicalType[] types;
        private final int[] pk;
        private final RowData.FieldGetter[] getters;
        // keyed by the JSON text of the PK values: deterministic, and fine for equality
        private final Map<String, ArrayNode> table = new TreeMap<>();
        // a sink without a primary key holds a multiset: how many copies of each row
        private final Map<String, Integer> copies = new TreeMap<>();

        Writer(Coordinator coord, String name, LogicalType[] types, int[] pk) {
            this.coord = coord;
            this.name = name;
            this.types = types;
            this.pk = pk;
            this.getters = new RowData.FieldGetter[types.length];
            for (int i = 0; i < types.length; i++) {
                getters[i] = RowData.createFieldGetter(types[i], i);
            }
        }

        @Override
        public void write(RowData element, Context context) {
            ArrayNode row = Rows.toJson(element, getters, types);
            ArrayNode key = JSON.createArrayNode();
            for (int i : pk) {
                key.add(row.get(i));
            }
            RowKind kind = element.getRowKind();
            coord.onSinkChange(name, kind.shortString(), row);
            boolean add = kind == RowKind.INSERT || kind == RowKind.UPDATE_AFTER;
            if (pk.length == 0) {
                String text = row.toString();
                int n = copies.getOrDefault(text, 0) + (add ? 1 : -1);
                if (n > 0) {
                    copies.put(text, n);
                    table.put(text, row);
                } else {
                    copies.remove(text);
                    table.remove(text);
                }
                return;
            }
            if (add) {
                table.put(key.toString(), row);
            } else {
                table.remove(key.toString());
            }
        }

        @Override
        public void writeWatermark(Watermark watermark) {
            ArrayNode snap = JSON.createArrayNode();
            for (Map.Entry<String, ArrayNode> e : table.entrySet()) {
                for (int i = copies.getOrDefault(e.getKey(), 1); i > 0; i--) {
                    snap.add(e.getValue());
                }
            }
            coord.onSinkWatermark(name, watermark.getTimestamp(), snap);
        }

        @Override
        public void flush(boolean endOfInput) {}

        @Override
        public void close() {}
    }
}
