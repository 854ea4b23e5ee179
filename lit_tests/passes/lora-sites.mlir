// RUN: stageml-opt %s -p 'lora-sites{max-rank=8,max-adapters=4}' | filecheck %s
// RUN: stageml-opt %s -p lora-sites | filecheck %s --check-prefix=DEFAULTS
// RUN: not stageml-opt %s -p 'lora-sites{max-rank=2}' 2>&1 | filecheck %s --check-prefix=RANK
// RUN: not stageml-opt %s -p 'lora-sites{rank=8}' 2>&1 | filecheck %s --check-prefix=OPTION

// PEFT's LoRA linear, x@W^T + 2.0*(x@A^T)@B^T with rank 4, on bt-propagate's
// output, becomes the canonical site: the factors are padded to rank 8 (the
// arguments' types change) and the scaling is gone (each adapter's B comes
// pre-scaled). The module records the site (its factors, shapes, rank and
// scaling) and the multi-tenant configuration.
// (lora-sites-no-site.mlir: a model without a LoRA site.)

// CHECK:         module attributes {
// CHECK-SAME:      bt.sites = [{dtype = "float32", experts = 0 : i64, in_features = 64 : i64, lora_A = "fc.lora_A.default.weight", lora_B = "fc.lora_B.default.weight", out_features = 48 : i64, rank = 4 : i64, scaling = 2.000000e+00 : f64}]
// CHECK-SAME:      bt.tenants = {max_adapters = 4 : i64, max_rank = 8 : i64}
// CHECK-LABEL: func.func @main
// CHECK-SAME:    %arg1: !torch.vtensor<[8,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}
// CHECK-SAME:    %arg2: !torch.vtensor<[48,8],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}
// CHECK-NOT:     torch.aten.mul.Scalar
// CHECK:         %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, {{.*}} -> !torch.vtensor<[64,48],f32>
// CHECK:         %[[AT:[0-9]+]] = torch.aten.transpose.int %arg1, {{.*}} {bt.time = #bt.time<"adapter">} : {{.*}} -> !torch.vtensor<[64,8],f32>
// CHECK-NEXT:    %[[BT:[0-9]+]] = torch.aten.transpose.int %arg2, {{.*}} {bt.time = #bt.time<"adapter">} : {{.*}} -> !torch.vtensor<[8,48],f32>
// CHECK-NEXT:    %[[Y:[0-9]+]] = torch.aten.matmul %arg3, %[[WT]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    %[[T:[0-9]+]] = torch.aten.matmul %arg3, %[[AT]] {bt.time = #bt.time<"dynamic">} : {{.*}} -> !torch.vtensor<[?,8],f32>
// CHECK-NEXT:    %[[U:[0-9]+]] = torch.aten.matmul %[[T]], %[[BT]] {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    %[[Z:[0-9]+]] = torch.aten.add.Tensor %[[Y]], %[[U]], %{{.*}} {bt.time = #bt.time<"dynamic">}
// CHECK-NEXT:    return %[[Z]]
// CHECK-NOT:     torch.aten.mul.Scalar

// The defaults: rank 16, one adapter slot.
// DEFAULTS:      module attributes {
// DEFAULTS-SAME:   bt.tenants = {max_adapters = 1 : i64, max_rank = 16 : i64}
// DEFAULTS:      %arg1: !torch.vtensor<[16,64],f32> {bt.name = "fc.lora_A.default.weight"

// A pass's options are its own, named in the pipeline.
// OPTION: stageml-opt: error: pass 'lora-sites' has no option 'rank=8': its options are max-rank, max-adapters

// RANK: stageml-opt: error: LoRA factor 'fc.lora_A.default.weight' has rank 4, above the maximum rank 2: compile with a max rank of at least 4
func.func @main(%arg0: !torch.vtensor<[48,64],f32> {bt.name = "fc.base_layer.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[4,64],f32> {bt.name = "fc.lora_A.default.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[48,4],f32> {bt.name = "fc.lora_B.default.weight", bt.time = #bt.time<"adapter">}, %arg3: !torch.vtensor<[?,64],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[?,48],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %float2.000000e00 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[48,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,48],f32>
  %1 = torch.aten.matmul %arg3, %0 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,48],f32> -> !torch.vtensor<[?,48],f32>
  %2 = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,64],f32>, !torch.int, !torch.int -> !torch.vtensor<[64,4],f32>
  %3 = torch.aten.matmul %arg3, %2 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,64],f32>, !torch.vtensor<[64,4],f32> -> !torch.vtensor<[?,4],f32>
  %4 = torch.aten.transpose.int %arg2, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[48,4],f32>, !torch.int, !torch.int -> !torch.vtensor<[4,48],f32>
  %5 = torch.aten.matmul %3, %4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,48],f32> -> !torch.vtensor<[?,48],f32>
  %6 = torch.aten.mul.Scalar %5, %float2.000000e00 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,48],f32>, !torch.float -> !torch.vtensor<[?,48],f32>
  %7 = torch.aten.add.Tensor %1, %6, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,48],f32>, !torch.vtensor<[?,48],f32>, !torch.int -> !torch.vtensor<[?,48],f32>
  return %7 : !torch.vtensor<[?,48],f32>
}
