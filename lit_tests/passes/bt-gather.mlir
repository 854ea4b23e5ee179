// RUN: stageml-opt %s -p bt-gather | filecheck %s
// RUN: stageml-opt %s -p bt-gather,bt-verify | filecheck %s --check-prefix=VERIFY

// Per-row tenants, on bt-lift's output of a multi-tenant compile: in the
// "factorized" program the adapter-time factors reach the request stage
// through bt.gather (stack = "slots": each row reads its slot's copy) by the
// new last input adapter_ids, and each product with them becomes a per-row
// (batched) product. A 2-D input is unsqueezed to rows of 1; its rows may be
// the request rows' tokens (transformers flattens [B, S] to B·S tokens in MoE
// blocks), so each takes the slot of its request row, and a count that is not
// a multiple of the request rows fails the call (the assertion). The "main"
// program (its LoRA merged by bt-improve) is left alone. The module's
// bt.tenants is bt-split's (bt-split-resident.mlir), not bt-gather's.

// CHECK-LABEL: func.func @main(
// CHECK-NOT:     adapter_ids
// CHECK-SAME:    attributes {bt.program = "main"}
// CHECK-NOT:     bt.gather
// CHECK:         "bt.lift"(%{{[0-9]+}}) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", to = #bt.time<"dynamic">}
// CHECK-NOT:     bt.gather
// CHECK:         return

// CHECK-LABEL: func.func @main_factorized
// CHECK-SAME:    %arg4: !torch.vtensor<[?],si64> {bt.name = "adapter_ids", bt.time = #bt.time<"dynamic">}
// CHECK-SAME:    attributes {bt.program = "factorized"}
// CHECK-NOT:     "bt.lift"(%{{[0-9]+}}) {{.*}}from = #bt.time<"adapter">
// CHECK:         %[[N:[0-9]+]] = torch.aten.size.int %arg3, %{{.*}} -> !torch.int
// CHECK:         %[[B:[0-9]+]] = torch.aten.size.int %arg4, %{{.*}} -> !torch.int
// CHECK-NEXT:    %[[PER:[0-9]+]] = torch.aten.floordiv.int %[[N]], %[[B]]
// CHECK-NEXT:    %[[ALL:[0-9]+]] = torch.aten.mul.int %[[B]], %[[PER]]
// CHECK-NEXT:    %[[WHOLE:[0-9]+]] = torch.aten.eq.int %[[ALL]], %[[N]]
// CHECK-NEXT:    torch.runtime.assert %[[WHOLE]], "a LoRA site's input rows do not line up with the request rows
// CHECK:         %[[COLUMN:[0-9]+]] = torch.aten.unsqueeze %arg4, {{.*}} -> !torch.vtensor<[?,1],si64>
// CHECK-NEXT:    %[[SIZES:[0-9]+]] = torch.prim.ListConstruct %[[B]], %[[PER]]
// CHECK:         %[[ONES:[0-9]+]] = torch.aten.ones %[[SIZES]], {{.*}} -> !torch.vtensor<[?,?],si64>
// CHECK-NEXT:    %[[SPREAD:[0-9]+]] = torch.aten.mul.Tensor %[[COLUMN]], %[[ONES]]
// CHECK:         %[[SLOTS:[0-9]+]] = torch.aten.flatten.using_ints %[[SPREAD]], {{.*}} -> !torch.vtensor<[?],si64>
// CHECK-NEXT:    %[[GA:[0-9]+]] = "bt.gather"(%{{[0-9]+}}, %[[SLOTS]]) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.0", stack = "slots", to = #bt.time<"dynamic">} : (!torch.vtensor<[64,16],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,64,16],f32>
// CHECK:         %[[X3:[0-9]+]] = torch.aten.unsqueeze %arg3, {{.*}} -> !torch.vtensor<[?,1,64],f32>
// CHECK-NEXT:    %[[T3:[0-9]+]] = torch.aten.matmul %[[X3]], %[[GA]] {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,64],f32>, !torch.vtensor<[?,64,16],f32> -> !torch.vtensor<[?,1,16],f32>
// CHECK-NEXT:    %{{.*}} = torch.constant.int 1
// CHECK-NEXT:    %[[T:[0-9]+]] = torch.aten.squeeze.dim %[[T3]], {{.*}} -> !torch.vtensor<[?,16],f32>
// CHECK:         torch.runtime.assert
// CHECK:         %[[GB:[0-9]+]] = "bt.gather"(%{{[0-9]+}}, %{{[0-9]+}}) {{.*}}name = "factorized.adapter.1", stack = "slots"{{.*}} -> !torch.vtensor<[?,16,48],f32>
// CHECK:         %[[T1:[0-9]+]] = torch.aten.unsqueeze %[[T]], {{.*}} -> !torch.vtensor<[?,1,16],f32>
// CHECK-NEXT:    %[[U3:[0-9]+]] = torch.aten.matmul %[[T1]], %[[GB]] {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,1,16],f32>, !torch.vtensor<[?,16,48],f32> -> !torch.vtensor<[?,1,48],f32>
// CHECK:         torch.aten.squeeze.dim %[[U3]], {{.*}} -> !torch.vtensor<[?,48],f32>
// CHECK-NOT:     "bt.lift"(%{{[0-9]+}}) {{.*}}from = #bt.time<"adapter">
// CHECK:         return

// The gathers are congruent, explicit stage crossings.
// VERIFY-LABEL: func.func @main_factorized
// VERIFY:         "bt.gather"
module attributes {bt.tenants = {max_adapters = 4 : i64, max_rank = 16 : i64}} {
  func.func @main(%arg0: !torch.vtensor<[48,64],f32> {bt.name = "fc.base_layer.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[48,16],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,64],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,48],f32> attributes {bt.program = "main"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[48,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,48],f32>
    %int0_0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1_1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %1 = torch.aten.transpose.int %arg1, %int0_0, %int1_1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,16],f32>
    %2 = torch.aten.transpose.int %arg2, %int0_0, %int1_1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[48,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[16,48],f32>
    %3 = torch.aten.mm %1, %2 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[64,16],f32>, !torch.vtensor<[16,48],f32> -> !torch.vtensor<[64,48],f32>
    %4 = "bt.lift"(%0) {bt.time = #bt.time<"adapter">, from = #bt.time<"static">, name = "static.0", to = #bt.time<"adapter">} : (!torch.vtensor<[64,48],f32>) -> !torch.vtensor<[64,48],f32>
    %5 = torch.aten.add.Tensor %4, %3, %int1_1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[64,48],f32>, !torch.vtensor<[64,48],f32>, !torch.int -> !torch.vtensor<[64,48],f32>
    %6 = "bt.lift"(%5) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[64,48],f32>) -> !torch.vtensor<[64,48],f32>
    %7 = torch.aten.matmul %arg3, %6 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,48],f32> -> !torch.vtensor<[?,48],f32>
    return %7 : !torch.vtensor<[?,48],f32>
  }
  func.func @main_factorized(%arg0: !torch.vtensor<[48,64],f32> {bt.name = "fc.base_layer.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[16,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[48,16],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,64],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,48],f32> attributes {bt.program = "factorized"} {
    %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[48,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,48],f32>
    %int0_0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
    %int1_1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
    %1 = torch.aten.transpose.int %arg1, %int0_0, %int1_1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[16,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,16],f32>
    %2 = torch.aten.transpose.int %arg2, %int0_0, %int1_1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[48,16],f32>, !torch.int, !torch.int -> !torch.vtensor<[16,48],f32>
    %3 = "bt.lift"(%0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "factorized.static.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[64,48],f32>) -> !torch.vtensor<[64,48],f32>
    %4 = torch.aten.matmul %arg3, %3 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,48],f32> -> !torch.vtensor<[?,48],f32>
    %5 = "bt.lift"(%1) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[64,16],f32>) -> !torch.vtensor<[64,16],f32>
    %6 = torch.aten.matmul %arg3, %5 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,16],f32> -> !torch.vtensor<[?,16],f32>
    %7 = "bt.lift"(%2) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "factorized.adapter.1", to = #bt.time<"dynamic">} : (!torch.vtensor<[16,48],f32>) -> !torch.vtensor<[16,48],f32>
    %8 = torch.aten.matmul %6, %7 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,16],f32>, !torch.vtensor<[16,48],f32> -> !torch.vtensor<[?,48],f32>
    %9 = torch.aten.add.Tensor %4, %8, %int1_1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,48],f32>, !torch.vtensor<[?,48],f32>, !torch.int -> !torch.vtensor<[?,48],f32>
    return %9 : !torch.vtensor<[?,48],f32>
  }
}
