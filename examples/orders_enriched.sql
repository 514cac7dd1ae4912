-- Orders with their customer's name, as a changelog topic: a LEFT JOIN of a Debezium
-- source with an upsert source (normalized first), COALESCE, UPPER and CASE. The join is
-- on customer_id, not on the orders' key, so an order's changes may be reordered between
-- join keys: the query has no upsert key and the sink needs ON CONFLICT.
CREATE TABLE orders (
  id BIGINT,
  customer_id BIGINT,
  amount DECIMAL(10, 2),
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'orders', 'format' = 'debezium-json');

CREATE TABLE customers (
  id BIGINT,
  name STRING,
  country STRING,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'customers', 'format' = 'upsert-json');

CREATE TABLE orders_enriched (
  order_id BIGINT,
  customer STRING,
  country STRING,
  amount DECIMAL(10, 2),
  size STRING,
  PRIMARY KEY (order_id) NOT ENFORCED
) WITH ('topic' = 'orders_enriched', 'format' = 'changelog-json');

INSERT INTO orders_enriched
SELECT o.id, COALESCE(c.name, 'unknown'), UPPER(c.country), o.amount,
       CASE WHEN o.amount >= 100 THEN 'large' ELSE 'small' END
FROM orders AS o
LEFT JOIN customers AS c ON o.customer_id = c.id
ON CONFLICT DO DEDUPLICATE;
