-- The inventory rollback example, resolved with DO NOTHING.
-- Products 1 and 2 are both "Football": two upsert keys (product_id) share one sink
-- key (name). DO NOTHING keeps the first row for a name and drops (and counts) the
-- others; no history is kept, so nothing is rolled back.
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
ON CONFLICT DO NOTHING;
