package tidemark.flinkoracle;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ArrayNode;
import org.apache.flink.table.data.DecimalData;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;
import org.apache.flink.table.data.TimestampData;
import org.apache.flink.table.types.logical.DecimalType;
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.types.RowKind;

import java.math.BigDecimal;
import java.time.LocalDateTime;
import java.time.format.DateTimeFormatter;

/** JSON values <-> Flink's internal row data, for the few column types the oracle supports. */
final class Rows {
    private static final ObjectMapper JSON = new ObjectMapper();
    /** Timestamps travel as ``yyyy-MM-dd HH:mm:ss.SSS`` text (or epoch milliseconds in). */
    private static final DateTimeFormatter TIMESTAMP = DateTimeFormatter.ofPattern("yyyy-MM-dd HH:mm:ss.SSS");

    private Rows() {}

    static RowKind kind(String shortString) {
        for (RowKind k : RowKind.values()) {
            if (k.shortString().equals(shortString)) {
                return k;
            }
        }
        throw new IllegalArgumentException("unknown row kind " + shortString);
    }

    static RowData toRowData(String kind, JsonNode row, LogicalType[] types, String table) {
        if (row.size() != types.length) {
            throw new IllegalArgumentException(
                    "table " + table + ": row " + row + " has " + row.size() + " values, expected " + types.length);
        }
        GenericRowData out = new GenericRowData(kind(kind), types.length);
        for (int i = 0; i < types.length; i++) {
            out.setField(i, toInternal(row.get(i), types[i], table));
        }
        return out;
    }

    private static Object toInternal(JsonNode v, LogicalType t, String table) {
        if (v == null || v.isNull()) {
            return null;
        }
        switch (t.getTypeRoot()) {
            case BIGINT:
                return v.asLong();
            case INTEGER:
                return v.asInt();
            case SMALLINT:
                return (short) v.asInt();
            case TINYINT:
                return (byte) v.asInt();
            case DOUBLE:
                return v.asDouble();
            case FLOAT:
                return (float) v.asDouble();
            case BOOLEAN:
                return v.asBoolean();
            case CHAR:
            case VARCHAR:
                return StringData.fromString(v.asText());
            case DECIMAL:
                DecimalType d = (DecimalType) t;
                return DecimalData.fromBigDecimal(new BigDecimal(v.asText()), d.getPrecision(), d.getScale());
            case TIMESTAMP_WITHOUT_TIME_ZONE:
                if (v.isNumber()) {
                    return TimestampData.fromEpochMillis(v.asLong());
                }
                return TimestampData.fromLocalDateTime(LocalDateTime.parse(v.asText().replace(' ', 'T')));
            default:
                throw new IllegalArgumentException("table " + table + ": unsupported column type " + t);
        }
    }

    static ArrayNode toJson(RowData row, RowData.FieldGetter[] getters, LogicalType[] types) {
        ArrayNode out = JSON.createArrayNode();
        for (int i = 0; i < getters.length; i++) {
            Object v = getters[i].getFieldOrNull(row);
            if (v == null) {
                out.addNull();
            } else if (v instanceof StringData) {
                out.add(v.toString());
            } else if (v instanceof DecimalData) {
                out.add(((DecimalData) v).toBigDecimal().toPlainString());
            } else if (v instanceof Long) {
                out.add((Long) v);
            } else if (v instanceof Integer) {
                out.add((Integer) v);
            } else if (v instanceof Short) {
                out.add((Short) v);
            } else if (v instanceof Byte) {
                out.add((Byte) v);
            } else if (v instanceof Double) {
                out.add((Double) v);
            } else if (v instanceof Float) {
                out.add((Float) v);
            } else if (v instanceof Boolean) {
                out.add((Boolean) v);
            } else if (v instanceof TimestampData) {
                out.add(((TimestampData) v).toLocalDateTime().format(TIMESTAMP));
            } else {
                throw new IllegalArgumentException("unsupported sink value type " + types[i]);
            }
        }
        return out;
    }
}
