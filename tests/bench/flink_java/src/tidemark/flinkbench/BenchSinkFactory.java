package tidemark.flinkbench;

import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.connector.sink.DynamicTableSink;
import org.apache.flink.table.connector.sink.SinkV2Provider;
import org.apache.flink.table.factories.DynamicTableSinkFactory;
import org.apache.flink.table.factories.FactoryUtil;
import org.apache.flink.table.types.logical.LogicalType;

import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * {@code 'connector' = 'tidemark-bench'}: an upsert sink (like upsert-kafka or JDBC, so Flink
 * plans its sink materializer exactly as for a real one) that keeps the table Flink writes in
 * memory and dumps it, with the end-of-input time, to {@code dir/part-<subtask>.json}.
 * {@code 'materialize' = 'false'} only counts and timestamps: a blackhole with an
 * end-of-input clock, to measure what keeping the table costs.
 */
public final class BenchSinkFactory implements DynamicTableSinkFactory {
    static final ConfigOption<String> DIR = ConfigOptions.key("dir").stringType().noDefaultValue();
    static final ConfigOption<Boolean> MATERIALIZE =
            ConfigOptions.key("materialize").booleanType().defaultValue(true);

    @Override
    public String factoryIdentifier() {
        return "tidemark-bench";
    }

    @Override
    public Set<ConfigOption<?>> requiredOptions() {
        Set<ConfigOption<?>> s = new HashSet<>();
        s.add(DIR);
        return s;
    }

    @Override
    public Set<ConfigOption<?>> optionalOptions() {
        Set<ConfigOption<?>> s = new HashSet<>();
        s.add(MATERIALIZE);
        return s;
    }

    @Override
    public DynamicTableSink createDynamicTableSink(Context context) {
        FactoryUtil.TableFactoryHelper helper = FactoryUtil.createTableFactoryHelper(this, context);
        helper.validate();
        List<LogicalType> types = context.getPhysicalRowDataType().getLogicalType().getChildren();
        return new Snk(helper.getOptions().get(DIR), helper.getOptions().get(MATERIALIZE),
                types.toArray(new LogicalType[0]), context.getPrimaryKeyIndexes());
    }

    static final class Snk implements DynamicTableSink {
        private final String dir;
        private final boolean materialize;
        private final LogicalType[] types;
        private final int[] pk;

        Snk(String dir, boolean materialize, LogicalType[] types, int[] pk) {
            this.dir = dir;
            this.materialize = materialize;
            this.types = types;
            this.pk = pk;
        }

        @Override
        public ChangelogMode getChangelogMode(ChangelogMode requested) {
            return ChangelogMode.upsert();
        }

        @Override
        public SinkRuntimeProvider getSinkRuntimeProvider(Context context) {
            return SinkV2Provider.of(new BenchSink(dir, materialize, types, pk));
        }

        @Override
        public DynamicTableSink copy() {
            return new Snk(dir, materialize, types, pk);
        }

        @Override
        public String asSummaryString() {
            return "tidemark-bench-sink";
        }
    }
}
