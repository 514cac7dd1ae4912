-- The two largest live orders per customer from a Debezium orders topic (Top-N with the
-- row number): keyed by (customer_id, rn), the sink's primary key, so no ON CONFLICT.
CREATE TABLE orders (
  id BIGINT,
  customer_id BIGINT,
  product STRING,
  amount DECIMAL(10, 2),
  status STRING,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'orders', 'format' = 'debezium-json');

CREATE TABLE top_orders (
  customer_id BIGINT,
  rn BIGINT,
  id BIGINT,
  amount DECIMAL(10, 2),
  PRIMARY KEY (customer_id, rn) NOT ENFORCED
) WITH ('topic' = 'top_orders', 'format' = 'upsert-json');

INSERT INTO top_orders
SELECT customer_id, rn, id, amount
FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY customer_id ORDER BY amount DESC) AS rn
  FROM orders
  WHERE status <> 'cancelled'
)
WHERE rn <= 2;
