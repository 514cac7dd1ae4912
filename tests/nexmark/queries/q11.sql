-- Adapted from Nexmark (https://github.com/nexmark/nexmark, commit 6b3646c3baec,
-- nexmark-flink/src/main/resources/queries/q11.sql), licensed under the Apache License 2.0.
-- Adaptations (see README.md in this folder): sources on Kafka topics, declared once in
-- sources.sql (run with --init sources.sql), Kafka sink.
-- -------------------------------------------------------------------------------------------------
-- Query 11: User Sessions (Not in original suite)
-- -------------------------------------------------------------------------------------------------
-- How many bids did a user make in each session they were active? Illustrates session windows.
--
-- Group bids by the same user into sessions with max session gap.
-- Emit the number of bids per session.
-- -------------------------------------------------------------------------------------------------

CREATE TABLE nexmark_q11 (
  bidder BIGINT,
  bid_count BIGINT,
  starttime TIMESTAMP(3),
  endtime TIMESTAMP(3)
) WITH (
  'connector' = 'kafka',
  'topic' = 'nexmark_q11',
  'format' = 'changelog-json'
);

INSERT INTO nexmark_q11
SELECT
    B.bidder,
    count(*) as bid_count,
    SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) as starttime,
    SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) as endtime
FROM bid B
GROUP BY B.bidder, SESSION(B.`dateTime`, INTERVAL '10' SECOND);
