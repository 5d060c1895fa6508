-- A 2-layer heterogeneous graph transformer over node(node_id, type, x) and edge(src, dst, type):
-- node types and edge types are values of the `type` columns, node features of one width (16).
-- Same function as torch_geometric's HGTConv(16, 16, metadata, heads=2) per layer:
--   k, q, v = K_t h + b, Q_t h + b, V_t h + b        (t: the node's type; 2 heads of 8)
--   score_e = (q_dst . W_att_r k_src) per head * p_r / sqrt(8)   (r: the edge's type)
--   m_i = sum_{e -> i} softmax_e(score_e) W_msg_r v_src          (over all in-edges of i)
--   a_i = A_t gelu(m_i) + b_t,   h_i' = s * a_i + (1 - s) * h_i,   s = sigmoid(skip_t)
-- Per-type matrices are typed linears, per-type vectors (biases, p_r, skip) embeddings of the
-- type column; W_att_r and W_msg_r act per head (PyG's are the block-diagonal case of these).
-- Every node here has in-edges (a node without them would drop out of m_i's relation).

CREATE TABLE hgt1_k AS
SELECT n.node_id, linear(n.x, 16, 'hgt1_k', n.type) + embed(n.type, 16, 'hgt1_kb') AS h
FROM node n;

CREATE TABLE hgt1_q AS
SELECT n.node_id, linear(n.x, 16, 'hgt1_q', n.type) + embed(n.type, 16, 'hgt1_qb') AS h
FROM node n;

CREATE TABLE hgt1_v AS
SELECT n.node_id, linear(n.x, 16, 'hgt1_v', n.type) + embed(n.type, 16, 'hgt1_vb') AS h
FROM node n;

CREATE TABLE hgt1_m AS
SELECT e.dst AS node_id,
       attention(sum_per_head(q.h * linear(k.h, 16, 'hgt1_att', e.type), 2) * embed(e.type, 2, 'hgt1_p') * 0.3535533905932738,
                 linear(v.h, 16, 'hgt1_msg', e.type)) AS h
FROM edge e
JOIN hgt1_k k ON k.node_id = e.src
JOIN hgt1_q q ON q.node_id = e.dst
JOIN hgt1_v v ON v.node_id = e.src
GROUP BY e.dst;

CREATE TABLE hgt1 AS
SELECT n.node_id,
       sigmoid(embed(n.type, 1, 'hgt1_skip')) * (linear(gelu(m.h), 16, 'hgt1_a', n.type) + embed(n.type, 16, 'hgt1_ab'))
       + (1 - sigmoid(embed(n.type, 1, 'hgt1_skip'))) * n.x AS h
FROM node n
JOIN hgt1_m m ON m.node_id = n.node_id;

-- layer 2: the same on layer 1's values
CREATE TABLE hgt2_k AS
SELECT n.node_id, linear(l.h, 16, 'hgt2_k', n.type) + embed(n.type, 16, 'hgt2_kb') AS h
FROM node n JOIN hgt1 l ON l.node_id = n.node_id;

CREATE TABLE hgt2_q AS
SELECT n.node_id, linear(l.h, 16, 'hgt2_q', n.type) + embed(n.type, 16, 'hgt2_qb') AS h
FROM node n JOIN hgt1 l ON l.node_id = n.node_id;

CREATE TABLE hgt2_v AS
SELECT n.node_id, linear(l.h, 16, 'hgt2_v', n.type) + embed(n.type, 16, 'hgt2_vb') AS h
FROM node n JOIN hgt1 l ON l.node_id = n.node_id;

CREATE TABLE hgt2_m AS
SELECT e.dst AS node_id,
       attention(sum_per_head(q.h * linear(k.h, 16, 'hgt2_att', e.type), 2) * embed(e.type, 2, 'hgt2_p') * 0.3535533905932738,
                 linear(v.h, 16, 'hgt2_msg', e.type)) AS h
FROM edge e
JOIN hgt2_k k ON k.node_id = e.src
JOIN hgt2_q q ON q.node_id = e.dst
JOIN hgt2_v v ON v.node_id = e.src
GROUP BY e.dst;

CREATE TABLE hgt2 AS
SELECT n.node_id,
       sigmoid(embed(n.type, 1, 'hgt2_skip')) * (linear(gelu(m.h), 16, 'hgt2_a', n.type) + embed(n.type, 16, 'hgt2_ab'))
       + (1 - sigmoid(embed(n.type, 1, 'hgt2_skip'))) * l.h AS h
FROM node n
JOIN hgt2_m m ON m.node_id = n.node_id
JOIN hgt1 l ON l.node_id = n.node_id;
