-- Bids per item in 10-second event-time windows, emitted once per window when the
-- watermark (the latest bid time seen, less 2 seconds) passes the window's end.
CREATE TABLE bids (
    item   BIGINT,
    price  BIGINT,
    ts     TIMESTAMP(3),
    WATERMARK FOR ts AS ts - INTERVAL '2' SECOND
) WITH ('topic' = 'bids', 'format' = 'json');

CREATE TABLE bids_per_window (
    item          BIGINT,
    window_start  TIMESTAMP(3),
    window_end    TIMESTAMP(3),
    bids          BIGINT,
    top_price     BIGINT
) WITH ('topic' = 'bids_per_window', 'format' = 'changelog-json');

INSERT INTO bids_per_window
SELECT item, window_start, window_end, COUNT(*), MAX(price)
FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))
GROUP BY item, window_start, window_end;
