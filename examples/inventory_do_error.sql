-- The inventory rollback example, resolved with DO ERROR.
-- Products 1 and 2 are both "Football": two upsert keys (product_id) share one sink
-- key (name). DO ERROR fails the pipeline when a batch ends with two active rows
-- for one name (exit status 3, naming the table and the key).
CREATE TABLE orders (product_id BIGINT, quantity BIGINT)
  WITH ('topic' = 'orders', 'format' = 'json');
CREATE TABLE products (id BIGINT, name STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('topic' = 'products', 'format' = 'debezium-json');
CREATE TABLE inventory (name STRING, quantity BIGINT, PRIMARY KEY (name) NOT ENFORCED)
  WITH ('topic' = 'inventory', 'format' = 'upsert-json');
INSERT INTO inventory
SELECT name, quantity
FROM (SELECT product_id, SUM(quantity) AS quantity FROM orders GROUP BY product_id) o
JOIN products p ON o.product_id = p.id
WHERE quantity < 10
ON CONFLICT DO ERROR;
