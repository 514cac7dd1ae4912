-- Each order enriched with its product's name as it is when the order is processed: a
-- lookup join (Flink's processing-time temporal join). A later rename of a product does
-- not change the orders already written.
CREATE TABLE orders (
  product_id BIGINT,
  quantity BIGINT,
  proc_time AS PROCTIME()
) WITH ('topic' = 'orders', 'format' = 'json');

CREATE TABLE products (
  id BIGINT,
  name STRING,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'products', 'format' = 'debezium-json');

CREATE TABLE orders_named (
  product_id BIGINT,
  quantity BIGINT,
  name STRING
) WITH ('topic' = 'orders_named', 'format' = 'changelog-json');

INSERT INTO orders_named
SELECT o.product_id, o.quantity, p.name
FROM orders AS o
LEFT JOIN products FOR SYSTEM_TIME AS OF o.proc_time AS p ON o.product_id = p.id;
