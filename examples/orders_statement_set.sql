-- One pipeline, two sinks: the open orders as they stand, and revenue per customer over
-- the same open orders. A statement set reads the orders topic once; the view's filter
-- is planned once and feeds both INSERTs, and each sink has its own conflict policy.
CREATE TABLE orders (
  id BIGINT,
  customer_id BIGINT,
  product STRING,
  amount DECIMAL(10, 2),
  status STRING,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'orders', 'format' = 'debezium-json');

CREATE TABLE open_orders (
  id BIGINT,
  customer_id BIGINT,
  amount DECIMAL(10, 2),
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'open_orders', 'format' = 'upsert-json');

CREATE TABLE open_revenue (
  customer_id BIGINT,
  orders BIGINT,
  revenue DECIMAL(38, 2),
  PRIMARY KEY (customer_id) NOT ENFORCED
) WITH ('topic' = 'open_revenue', 'format' = 'changelog-json');

CREATE VIEW open_order AS SELECT id, customer_id, amount FROM orders WHERE status <> 'cancelled';

EXECUTE STATEMENT SET BEGIN
  INSERT INTO open_orders SELECT * FROM open_order;
  INSERT INTO open_revenue SELECT customer_id, COUNT(*), SUM(amount) FROM open_order GROUP BY customer_id;
END;
