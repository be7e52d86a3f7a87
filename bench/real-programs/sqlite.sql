-- sqlite3 in memory: two tables with indexes, a join and a sort (about 380 MiB).
PRAGMA cache_size = -1000000;
CREATE TABLE a(id INTEGER PRIMARY KEY, k INTEGER, pad TEXT);
CREATE TABLE b(id INTEGER PRIMARY KEY, k INTEGER, v INTEGER, pad TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 600000)
INSERT INTO a SELECT i, (i * 7919) % 500000, printf('%.200c', 'a') FROM n;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 600000)
INSERT INTO b SELECT i, (i * 104729) % 500000, i % 1000, printf('%.200c', 'b') FROM n;
CREATE INDEX a_k ON a(k);
CREATE INDEX b_k ON b(k);
SELECT count(*), sum(b.v) FROM a JOIN b ON a.k = b.k;
SELECT sum(x) FROM (SELECT a.k * 3 + b.v AS x FROM a JOIN b ON a.id = b.id ORDER BY a.pad, x LIMIT 100000);
