-- Each bid with the average and the highest price of its item's last three bids (itself and
-- the two before it in event time), emitted when the watermark (the latest bid time seen,
-- less 2 seconds) passes the bid.
CREATE TABLE bids (
    item   BIGINT,
    price  BIGINT,
    ts     TIMESTAMP(3),
    WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH ('topic' = 'bids', 'format' = 'json');

CREATE TABLE bids_moving_average (
    item       BIGINT,
    ts         TIMESTAMP(3),
    price      BIGINT,
    avg_price  BIGINT,
    top_price  BIGINT
) WITH ('topic' = 'bids_moving_average', 'format' = 'changelog-json');

INSERT INTO bids_moving_average
SELECT item, ts, price,
       AVG(price) OVER (PARTITION BY item ORDER BY ts ROWS BETWEEN 2 PRECEDING AND CURRENT ROW),
       MAX(price) OVER (PARTITION BY item ORDER BY ts ROWS BETWEEN 2 PRECEDING AND CURRENT ROW)
FROM bids;
