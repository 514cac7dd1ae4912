-- Every bid with the asks of its item in the same 10-second event-time window that it
-- meets (bid price >= ask price), or NULL when none (a LEFT window join), emitted once
-- per window when the watermark of both topics passes its end.
CREATE TABLE bids (
    item   BIGINT,
    price  BIGINT,
    ts     TIMESTAMP(3),
    WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH ('topic' = 'bids', 'format' = 'json');

CREATE TABLE asks (
    item   BIGINT,
    price  BIGINT,
    ts     TIMESTAMP(3),
    WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH ('topic' = 'asks', 'format' = 'json');

CREATE TABLE matches (
    item          BIGINT,
    window_start  TIMESTAMP(3),
    bid           BIGINT,
    ask           BIGINT
) WITH ('topic' = 'matches', 'format' = 'changelog-json');

INSERT INTO matches
SELECT B.item, B.window_start, B.price, A.price
FROM (SELECT * FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))) B
LEFT JOIN (SELECT * FROM TABLE(TUMBLE(TABLE asks, DESCRIPTOR(ts), INTERVAL '10' SECOND))) A
ON B.item = A.item AND B.window_start = A.window_start AND B.window_end = A.window_end
   AND B.price >= A.price;
