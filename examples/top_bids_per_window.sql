-- The two highest bids of every 10-second event-time window (a window Top-N), emitted once
-- per window when the watermark (the latest bid time seen, less 2 seconds) passes its end.
CREATE TABLE bids (
    item   BIGINT,
    price  BIGINT,
    ts     TIMESTAMP(3),
    WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH ('topic' = 'bids', 'format' = 'json');

CREATE TABLE top_bids (
    window_start  TIMESTAMP(3),
    rn            BIGINT,
    item          BIGINT,
    price         BIGINT
) WITH ('topic' = 'top_bids', 'format' = 'changelog-json');

INSERT INTO top_bids
SELECT window_start, rn, item, price
FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY price DESC) AS rn
  FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))
)
WHERE rn <= 2;
