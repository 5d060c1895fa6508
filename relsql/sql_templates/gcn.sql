-- A 2-layer GCN (Kipf & Welling) over the TU tables graph / node / edge, then a graph readout.
-- Same function as torch_geometric's GCNConv with its defaults (add_self_loops, normalize, bias):
--   h_i' = sum over edges j -> i of the graph with self loops added of
--          norm_ji * W h_j, plus b,   norm_ji = 1 / sqrt(deg_j * deg_i),
-- deg = in-degree counted with the self loop. Messages flow src -> dst, as in the edge table.
-- The propagation set and its coefficients are plain SQL in the FROM subquery: one grounding
-- per (edge or self loop), summed per target node.

-- node features as a relation: joined by key below, so the plan gathers (or sparsely multiplies)
-- one row per node instead of reading a copy of x for every edge from the database
CREATE TABLE node_x AS
SELECT n.node_id, n.x AS h
FROM node n;

-- layer 1: one-hot node labels x (7) -> 16, ReLU
CREATE TABLE gcn1 AS
SELECT e.dst AS node_id,
       relu(sum(e.norm * linear(n.h, 16, 'gcn1_w')) + bias(16, 'gcn1_b')) AS h
FROM (
    -- existing self loops are replaced by exactly one loop per node (PyG: add_remaining_self_loops)
    WITH arcs AS (
        SELECT src, dst FROM edge WHERE src <> dst
        UNION ALL
        SELECT node_id AS src, node_id AS dst FROM node
    ),
    deg AS (SELECT dst AS node_id, count(*) AS d FROM arcs GROUP BY dst)
    SELECT a.src, a.dst, 1.0 / sqrt(ds.d * dd.d) AS norm
    FROM arcs a
    JOIN deg ds ON ds.node_id = a.src
    JOIN deg dd ON dd.node_id = a.dst
) e
JOIN node_x n ON n.node_id = e.src
GROUP BY e.dst;

-- layer 2: 16 -> 16, no activation (the readout follows)
CREATE TABLE gcn2 AS
SELECT e.dst AS node_id,
       sum(e.norm * linear(l.h, 16, 'gcn2_w')) + bias(16, 'gcn2_b') AS h
FROM (
    WITH arcs AS (
        SELECT src, dst FROM edge WHERE src <> dst
        UNION ALL
        SELECT node_id AS src, node_id AS dst FROM node
    ),
    deg AS (SELECT dst AS node_id, count(*) AS d FROM arcs GROUP BY dst)
    SELECT a.src, a.dst, 1.0 / sqrt(ds.d * dd.d) AS norm
    FROM arcs a
    JOIN deg ds ON ds.node_id = a.src
    JOIN deg dd ON dd.node_id = a.dst
) e
JOIN gcn1 l ON l.node_id = e.src
GROUP BY e.dst;

-- readout: mean of the node embeddings of each graph (PyG global_mean_pool)
CREATE TABLE gcn_pool AS
SELECT n.graph_id, avg(l.h) AS h
FROM node n
JOIN gcn2 l ON l.node_id = n.node_id
GROUP BY n.graph_id;

-- graph logits for the 2 classes (nn.Linear(16, 2))
CREATE TABLE gcn_out AS
SELECT p.graph_id, linear(p.h, 2, 'gcn_out_w') + bias(2, 'gcn_out_b') AS h
FROM gcn_pool p;
