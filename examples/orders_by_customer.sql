-- Revenue per customer from a Debezium orders topic: a GROUP BY whose key is the sink's
-- primary key, so the sink needs no materializer and no ON CONFLICT clause.
CREATE TABLE orders (
  id BIGINT,
  customer_id BIGINT,
  product STRING,
  amount DECIMAL(10, 2),
  status STRING,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'orders', 'format' = 'debezium-json');

CREATE TABLE revenue_by_customer (
  customer_id BIGINT,
  orders BIGINT,
  products BIGINT,
  revenue DECIMAL(38, 2),
  largest DECIMAL(10, 2),
  PRIMARY KEY (customer_id) NOT ENFORCED
) WITH ('topic' = 'revenue_by_customer', 'format' = 'upsert-json');

INSERT INTO revenue_by_customer
SELECT customer_id, COUNT(*), COUNT(DISTINCT product), SUM(amount), MAX(amount)
FROM orders
WHERE status <> 'cancelled'
GROUP BY customer_id
HAVING SUM(amount) > 0;
