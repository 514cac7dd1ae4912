-- Flink SQL as pasted: backtick-quoted identifiers, a view, a CTE, SELECT DISTINCT and an
-- aggregate FILTER. Each plans onto the stages the other examples use (a calc, a group
-- aggregate for DISTINCT, one for the GROUP BY); the group key is the sink's primary key.
CREATE TABLE orders (
  id BIGINT,
  customer_id BIGINT,
  product STRING,
  amount DECIMAL(10, 2),
  status STRING,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'orders', 'format' = 'debezium-json');

CREATE TABLE products_per_customer (
  customer_id BIGINT,
  products BIGINT,
  balls BIGINT,
  PRIMARY KEY (customer_id) NOT ENFORCED
) WITH ('topic' = 'products_per_customer', 'format' = 'upsert-json');

CREATE TEMPORARY VIEW `live_orders` AS
SELECT `id`, `customer_id`, UPPER(product) AS product
FROM orders
WHERE status <> 'cancelled';

INSERT INTO products_per_customer
WITH bought AS (SELECT DISTINCT customer_id, product FROM `live_orders`)
SELECT customer_id, COUNT(*), COUNT(*) FILTER (WHERE product = 'BALL')
FROM bought
GROUP BY customer_id;
