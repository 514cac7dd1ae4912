package tidemark.flinkbench;

import org.apache.flink.api.common.JobID;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.configuration.MetricOptions;
import org.apache.flink.configuration.TaskManagerOptions;
import org.apache.flink.core.execution.CheckpointType;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;

/**
 * A mini-cluster in the PyFlink gateway JVM, reached over REST. Why not PyFlink's local
 * executor: the runner needs the cluster's REST endpoint (job timestamps, checkpoint sizes)
 * and a way to trigger the final checkpoint the moment the input is drained, instead of
 * waiting for the next periodic one.
 */
public final class BenchCluster {
    private static MiniCluster cluster;

    private BenchCluster() {}

    /** Starts the cluster (once) and returns its REST port. */
    public static synchronized int start(int slots, int networkMb) throws Exception {
        if (cluster == null) {
            Configuration conf = new Configuration();
            conf.set(TaskManagerOptions.NETWORK_MEMORY_MIN, MemorySize.ofMebiBytes(networkMb));
            conf.set(TaskManagerOptions.NETWORK_MEMORY_MAX, MemorySize.ofMebiBytes(networkMb));
            // the REST API's IO metrics are refreshed this often (default 10 s): the runner
            // samples the sources' progress for the sustained mode's steady-state clock
            conf.set(MetricOptions.METRIC_FETCHER_UPDATE_INTERVAL, java.time.Duration.ofMillis(200));
            MiniClusterConfiguration cfg = new MiniClusterConfiguration.Builder()
                    .setConfiguration(conf)
                    .setNumTaskManagers(1)
                    .setNumSlotsPerTaskManager(slots)
                    .withRandomPorts()
                    .build();
            MiniCluster mc = new MiniCluster(cfg);
            mc.start();
            cluster = mc;
        }
        return cluster.getRestAddress().get().getPort();
    }

    /** Triggers a (full) checkpoint of {@code jobId} and waits for it; returns its id, or -1
     * when it could not complete (e.g. the job finished meanwhile). */
    public static long checkpoint(String jobId, long timeoutMs) {
        try {
            return cluster.triggerCheckpoint(JobID.fromHexString(jobId), CheckpointType.FULL)
                    .get(timeoutMs, java.util.concurrent.TimeUnit.MILLISECONDS);
        } catch (Exception e) {
            return -1;
        }
    }

    public static synchronized void stop() throws Exception {
        if (cluster != null) {
            cluster.closeAsync().get();
            cluster = null;
        }
    }
}
