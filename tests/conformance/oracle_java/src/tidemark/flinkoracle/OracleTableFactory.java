package tidemark.flinkoracle;

import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.connector.sink.DynamicTableSink;
import org.apache.flink.table.connector.sink.SinkV2Provider;
import org.apache.flink.table.connector.source.DynamicTableSource;
import org.apache.flink.table.connector.source.ScanTableSource;
import org.apache.flink.table.connector.source.SourceProvider;
import org.apache.flink.table.connector.source.abilities.SupportsSourceWatermark;
import org.apache.flink.table.connector.source.abilities.SupportsWatermarkPushDown;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.factories.DynamicTableSinkFactory;
import org.apache.flink.table.factories.DynamicTableSourceFactory;
import org.apache.flink.table.factories.FactoryUtil;
import org.apache.flink.table.types.logical.LogicalType;

import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * {@code 'connector' = 'tidemark-oracle'}: sources replay a case's changelog through the
 * {@link Coordinator}; the sink materializes the upsert stream Flink writes.
 */
public final class OracleTableFactory implements DynamicTableSourceFactory, DynamicTableSinkFactory {
    static final ConfigOption<String> CASE = ConfigOptions.key("case").stringType().noDefaultValue();
    static final ConfigOption<String> TABLE = ConfigOptions.key("table").stringType().noDefaultValue();
    static final ConfigOption<String> MODE =
            ConfigOptions.key("changelog-mode").stringType().defaultValue("all");

    @Override
    public String factoryIdentifier() {
        return "tidemark-oracle";
    }

    @Override
    public Set<ConfigOption<?>> requiredOptions() {
        Set<ConfigOption<?>> s = new HashSet<>();
        s.add(CASE);
        return s;
    }

    @Override
    public Set<ConfigOption<?>> optionalOptions() {
        Set<ConfigOption<?>> s = new HashSet<>();
        s.add(TABLE);
        s.add(MODE);
        return s;
    }

    private static LogicalType[] types(Context context) {
        List<org.apache.flink.table.types.DataType> fields =
                context.getPhysicalRowDataType().getChildren();
        LogicalType[] out = new LogicalType[fields.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = fields.get(i).getLogicalType();
        }
        return out;
    }

    @Override
    public DynamicTableSource createDynamicTableSource(Context context) {
        FactoryUtil.TableFactoryHelper helper = FactoryUtil.createTableFactoryHelper(this, context);
        helper.validate();
        String caseId = helper.getOptions().get(CASE);
        String table = helper.getOptions().getOptional(TABLE)
                .orElse(context.getObjectIdentifier().getObjectName());
        String mode = helper.getOptions().get(MODE);
        return new Src(caseId, table, mode, types(context));
    }

    @Override
    public DynamicTableSink createDynamicTableSink(Context context) {
        FactoryUtil.TableFactoryHelper helper = FactoryUtil.createTableFactoryHelper(this, context);
        helper.validate();
        return new Snk(helper.getOptions().get(CASE), context.getObjectIdentifier().getObjectName(),
                types(context), context.getPrimaryKeyIndexes());
    }

    static final class Src implements ScanTableSource, SupportsSourceWatermark, SupportsWatermarkPushDown {
        private final String caseId;
        private final String table;
        private final String mode;
        private final LogicalType[] types;

        Src(String caseId, String table, String mode, LogicalType[] types) {
            this.caseId = caseId;
            this.table = table;
            this.mode = mode;
            this.types = types;
        }

        @Override
        public ChangelogMode getChangelogMode() {
            switch (mode) {
                case "all":
                    return ChangelogMode.all();
                case "upsert":
                    return ChangelogMode.upsert();
                case "insert-only":
                    return ChangelogMode.insertOnly();
                default:
                    throw new IllegalArgumentException("changelog-mode must be all, upsert or insert-only, got " + mode);
            }
        }

        @Override
        public ScanRuntimeProvider getScanRuntimeProvider(ScanContext ctx) {
            Coordinator.expectSource(caseId, table);
            return SourceProvider.of(new OracleSource(caseId, table, types));
        }

        /** The reader emits the batch watermarks itself ({@code SOURCE_WATERMARK()}). */
        @Override
        public void applySourceWatermark() {}

        /**
         * A declared {@code WATERMARK FOR col AS expr} is taken over by the reader too: it
         * still ends batch i with watermark i, far below any event time, so no record is
         * ever late and event-time windows and timers fire only at the end of input. That
         * makes the final table deterministic (no dependence on when Flink's periodic
         * watermark generator happens to run) at the price of per-batch window results.
         */
        @Override
        public void applyWatermark(WatermarkStrategy<RowData> watermarkStrategy) {}

        @Override
        public DynamicTableSource copy() {
            return new Src(caseId, table, mode, types);
        }

        @Override
        public String asSummaryString() {
            return "tidemark-oracle(" + table + ")";
        }
    }

    static final class Snk implements DynamicTableSink {
        private final String caseId;
        private final String name;
        private final LogicalType[] types;
        private final int[] pk;

        Snk(String caseId, String name, LogicalType[] types, int[] pk) {
            this.caseId = caseId;
            this.name = name;
            this.types = types;
            this.pk = pk;
        }

        @Override
        public ChangelogMode getChangelogMode(ChangelogMode requested) {
            return ChangelogMode.upsert();
        }

        @Override
        public SinkRuntimeProvider getSinkRuntimeProvider(Context context) {
            return SinkV2Provider.of(new OracleSink(caseId, name, types, pk));
        }

        @Override
        public DynamicTableSink copy() {
            return new Snk(caseId, name, types, pk);
        }

        @Override
        public String asSummaryString() {
            return "tidemark-oracle-sink";
        }
    }
}
