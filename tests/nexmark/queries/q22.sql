-- Adapted from Nexmark (https://github.com/nexmark/nexmark, commit 6b3646c3baec,
-- nexmark-flink/src/main/resources/queries/q22.sql), licensed under the Apache License 2.0.
-- Adaptations (see README.md in this folder): sources on Kafka topics, declared once in
-- sources.sql (run with --init sources.sql), Kafka sink.
-- -------------------------------------------------------------------------------------------------
-- Query 22: Get URL Directories (Not in original suite)
-- -------------------------------------------------------------------------------------------------
-- What is the directory structure of the URL?
-- Illustrates a SPLIT_INDEX SQL.
-- -------------------------------------------------------------------------------------------------

CREATE TABLE nexmark_q22 (
      auction  BIGINT,
      bidder  BIGINT,
      price  BIGINT,
      channel  VARCHAR,
      dir1  VARCHAR,
      dir2  VARCHAR,
      dir3  VARCHAR
) WITH (
  'connector' = 'kafka',
  'topic' = 'nexmark_q22',
  'format' = 'changelog-json'
);

INSERT INTO nexmark_q22
SELECT
    auction, bidder, price, channel,
    SPLIT_INDEX(url, '/', 3) as dir1,
    SPLIT_INDEX(url, '/', 4) as dir2,
    SPLIT_INDEX(url, '/', 5) as dir3 FROM bid;
