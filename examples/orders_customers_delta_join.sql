-- A delta join: no join state in Spark. Each change of one side looks the other side's
-- rows up in the index service (tidemark run starts one when none is given). orders
-- declares an index on customer_id, customers is looked up by its primary key; customers
-- is append-only, as eventual consistency requires of one side.
SET 'table.optimizer.delta-join.strategy' = 'FORCE';
SET 'table.exec.delta-join.consistency' = 'eventual';

CREATE TABLE orders (id BIGINT, customer_id BIGINT, amount BIGINT, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'orders', 'format' = 'debezium-json', 'index.by_customer.columns' = 'customer_id');

CREATE TABLE customers (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'customers', 'format' = 'json');

CREATE TABLE order_customers (
  order_id BIGINT,
  customer_id BIGINT,
  name STRING,
  amount BIGINT,
  PRIMARY KEY (order_id, customer_id) NOT ENFORCED
) WITH ('topic' = 'order_customers', 'format' = 'upsert-json');

INSERT INTO order_customers
SELECT o.id, c.id, c.name, o.amount FROM orders AS o JOIN customers AS c ON o.customer_id = c.id;
