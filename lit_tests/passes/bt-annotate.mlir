// RUN: stageml-opt %s -p bt-annotate --stage 'fc.weight=static' | filecheck %s

// Each argument gets the time of the last --stage glob that matches its
// bt.name; PEFT's adapter names are adapter-time by default; the others are
// request-time. Ops are left alone. Every program function (bt.program,
// here "main" and "factorized") is annotated; another function is not.
// (bt-annotate-defaults.mlir: the same without --stage.)

// CHECK-LABEL: func.func @main
// CHECK-SAME: %arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}
// CHECK-SAME: %arg1: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.weight", bt.time = #bt.time<"adapter">}
// CHECK-SAME: %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}
// CHECK-SAME: %arg3: !torch.vtensor<[4],f32> {bt.time = #bt.time<"dynamic">}
// CHECK-SAME: attributes {bt.program = "main"}
// CHECK: torch.aten.transpose.int %arg0, %int0, %int1 :
// CHECK-NOT: bt.time
// CHECK: return

// CHECK-LABEL: func.func @main_factorized
// CHECK-SAME: %arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}
// CHECK-SAME: %arg1: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}
// CHECK-SAME: attributes {bt.program = "factorized"}
// CHECK-NOT: bt.time
// CHECK: return

// CHECK-LABEL: func.func @helper
// CHECK-SAME: (%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight"})
// CHECK-NOT: bt.time
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight"}, %arg1: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.weight"}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x"}, %arg3: !torch.vtensor<[4],f32>) -> !torch.vtensor<[8,4],f32> attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  return %0 : !torch.vtensor<[8,4],f32>
}

func.func @main_factorized(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight"}, %arg1: !torch.vtensor<[?,8],f32> {bt.name = "x"}) -> !torch.vtensor<[4,8],f32> attributes {bt.program = "factorized"} {
  return %arg0 : !torch.vtensor<[4,8],f32>
}

func.func @helper(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight"}) -> !torch.vtensor<[4,8],f32> {
  return %arg0 : !torch.vtensor<[4,8],f32>
}
