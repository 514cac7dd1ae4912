-- Adapted from Nexmark (https://github.com/nexmark/nexmark, commit 6b3646c3baec,
-- nexmark-flink/src/main/resources/queries/q18.sql), licensed under the Apache License 2.0.
-- Adaptations (see README.md in this folder): sources on Kafka topics, declared once in
-- sources.sql (run with --init sources.sql), Kafka sink.
-- -------------------------------------------------------------------------------------------------
-- Query 18: Find last bid (Not in original suite)
-- -------------------------------------------------------------------------------------------------
-- What's a's last bid for bidder to auction?
-- Illustrates a Deduplicate query.
-- -------------------------------------------------------------------------------------------------

CREATE TABLE nexmark_q18 (
    auction  BIGINT,
    bidder  BIGINT,
    price  BIGINT,
    channel  VARCHAR,
    url  VARCHAR,
    `dateTime`  TIMESTAMP(3),
    extra  VARCHAR,
  PRIMARY KEY (auction, bidder) NOT ENFORCED
) WITH (
  'connector' = 'kafka',
  'topic' = 'nexmark_q18',
  'format' = 'upsert-json'
);

INSERT INTO nexmark_q18
SELECT auction, bidder, price, channel, url, `dateTime`, extra
 FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY `dateTime` DESC) AS rank_number
       FROM bid)
 WHERE rank_number <= 1;
