-- The latest bid per item by processing time: each bid replaces the one before it
-- (Flink's Deduplicate keeping the last row). ORDER BY p ASC would keep the first.
CREATE TABLE bids (
    item   BIGINT,
    price  BIGINT,
    ts     TIMESTAMP(3),
    p AS PROCTIME()
) WITH ('topic' = 'bids', 'format' = 'json');

CREATE TABLE latest_bid (
    item   BIGINT,
    price  BIGINT,
    PRIMARY KEY (item) NOT ENFORCED
) WITH ('topic' = 'latest_bid', 'format' = 'upsert-json');

INSERT INTO latest_bid
SELECT item, price
FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY item ORDER BY p DESC) AS rn
  FROM bids
)
WHERE rn = 1;
