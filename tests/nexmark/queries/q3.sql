-- Adapted from Nexmark (https://github.com/nexmark/nexmark, commit 6b3646c3baec,
-- nexmark-flink/src/main/resources/queries/q3.sql), licensed under the Apache License 2.0.
-- Adaptations (see README.md in this folder): sources on Kafka topics, declared once in
-- sources.sql (run with --init sources.sql), Kafka sink.
-- -------------------------------------------------------------------------------------------------
-- Query 3: Local Item Suggestion
-- -------------------------------------------------------------------------------------------------
-- Who is selling in OR, ID or CA in category 10, and for what auction ids?
-- Illustrates an incremental join (using per-key state and timer) and filter.
-- -------------------------------------------------------------------------------------------------

CREATE TABLE nexmark_q3 (
  name  VARCHAR,
  city  VARCHAR,
  state  VARCHAR,
  id  BIGINT
) WITH (
  'connector' = 'kafka',
  'topic' = 'nexmark_q3',
  'format' = 'changelog-json'
);

INSERT INTO nexmark_q3
SELECT
    P.name, P.city, P.state, A.id
FROM
    auction AS A INNER JOIN person AS P on A.seller = P.id
WHERE
    A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA');
