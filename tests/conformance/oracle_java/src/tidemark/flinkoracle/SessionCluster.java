package tidemark.flinkoracle;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.configuration.TaskManagerOptions;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;

/**
 * One long-lived Flink mini-cluster in the gateway JVM, reached over its REST endpoint.
 *
 * <p>Why: PyFlink's local executor starts a fresh mini-cluster per job (seconds each). With one
 * session cluster, every case can be its own job: cheap, concurrent (one slot each), and a case
 * whose job fails (ON CONFLICT DO ERROR) takes nothing else down.
 */
public final class SessionCluster {
    private static MiniCluster cluster;

    private SessionCluster() {}

    /** Starts the cluster (once) and returns its REST port. */
    public static synchronized int start(int slots, int networkMb) throws Exception {
        if (cluster == null) {
            Configuration conf = new Configuration();
            conf.set(TaskManagerOptions.NETWORK_MEMORY_MIN, MemorySize.ofMebiBytes(networkMb));
            conf.set(TaskManagerOptions.NETWORK_MEMORY_MAX, MemorySize.ofMebiBytes(networkMb));
            conf.set(TaskManagerOptions.MEMORY_SEGMENT_SIZE, MemorySize.parse("4kb"));
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

    /** Asks the cluster for a checkpoint of {@code jobId} (hex); completes with its id. */
    static synchronized java.util.concurrent.CompletableFuture<Long> triggerCheckpoint(String jobId) {
        if (cluster == null) {
            java.util.concurrent.CompletableFuture<Long> f = new java.util.concurrent.CompletableFuture<>();
            f.completeExceptionally(new IllegalStateException("no session cluster"));
            return f;
        }
        return cluster.triggerCheckpoint(
                org.apache.flink.api.common.JobID.fromHexString(jobId),
                org.apache.flink.core.execution.CheckpointType.CONFIGURED);
    }

    public static synchronized void stop() throws Exception {
        if (cluster != null) {
            cluster.closeAsync().get();
            cluster = null;
        }
    }
}
