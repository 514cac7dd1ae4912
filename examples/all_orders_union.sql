-- Orders from two systems as one stream: UNION ALL of two CDC tables. The branches' types
-- differ (DECIMAL and INT widen to DECIMAL); the columns are named as the first branch's.
-- A union has no upsert key, so the keyed sink says how to resolve conflicts.
CREATE TABLE web_orders (
  id BIGINT,
  customer_id BIGINT,
  amount DECIMAL(10, 2),
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'web_orders', 'format' = 'debezium-json');

CREATE TABLE shop_orders (
  id BIGINT,
  customer_id BIGINT,
  total INT,
  PRIMARY KEY (id) NOT ENFORCED
) WITH ('topic' = 'shop_orders', 'format' = 'debezium-json');

CREATE TABLE all_orders (
  source STRING,
  id BIGINT,
  customer_id BIGINT,
  amount DECIMAL(38, 2),
  PRIMARY KEY (source, id) NOT ENFORCED
) WITH ('topic' = 'all_orders', 'format' = 'upsert-json');

INSERT INTO all_orders
SELECT 'web', id, customer_id, amount FROM web_orders
UNION ALL
SELECT 'shop', id, customer_id, total FROM shop_orders
ON CONFLICT DO DEDUPLICATE;
