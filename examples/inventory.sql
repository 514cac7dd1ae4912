-- The inventory rollback example (SUM(quantity) per product, keyed by product name).
-- Products 1 and 2 are both "Football": two upsert keys (product_id) share one sink
-- key (name). DO DEDUPLICATE keeps the latest active row and rolls back to the
-- previous one when the latest is retracted.
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
ON CONFLICT DO DEDUPLICATE;
