-- The s1/s2 join example: changelog disorder and the sink upsert materializer.
-- s1.level is not s1's key, so the join on it drops the upsert key: the sink needs a
-- materializer keyed by t1.id, and the pipeline must say how conflicts resolve.
CREATE TABLE s1 (id BIGINT, level BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 's1', 'format' = 'debezium-json');
CREATE TABLE s2 (id BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 's2', 'format' = 'debezium-json');
CREATE TABLE t1 (id BIGINT, level BIGINT, attr STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 't1', 'format' = 'upsert-json');
INSERT INTO t1 SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id
  ON CONFLICT DO DEDUPLICATE;
